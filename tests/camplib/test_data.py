"""camplib.data: corpus split, de-duplication, MinHash/LSH, packing, sharded loading, random windows."""
import math
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from camplib.data import (
    MinHash,
    ShardSampler,
    _mulmod_p,
    dedup_exact,
    estimate_jaccard,
    get_batch,
    lsh_params,
    make_loader,
    near_duplicates,
    pack,
    read_corpus,
    shingles,
    split_files,
    stdlib_files,
    stdlib_root,
)

P61 = (1 << 61) - 1
# MinHash: |estimate - J| <= SIGMAS * sqrt(J (1 - J) / num_perm) + 1 / num_perm (binomial error)
SIGMAS = 4


# ---------------------------------------------------------------- corpus and split

def test_stdlib_files_sorted_and_clean():
    files = stdlib_files()
    rel = [p.relative_to(stdlib_root()).as_posix() for p in files]
    assert len(files) > 500 and rel == sorted(rel)
    assert all(p.suffix == ".py" and "site-packages" not in r for p, r in zip(files, rel))
    assert "json/encoder.py" in rel


def test_split_is_deterministic_disjoint_and_covering():
    files = stdlib_files()
    train, val = split_files(files, val_fraction=0.05)
    assert sorted(train + val) == sorted(files) and not set(train) & set(val)
    n = len(files)  # val size ~ Binomial(n, 0.05): within 4 sigma
    assert abs(len(val) - 0.05 * n) <= 4 * math.sqrt(n * 0.05 * 0.95)
    # a file's side depends only on its own relative path: any subset splits the same way
    subset = files[::7]
    sub_train, sub_val = split_files(subset)
    assert set(sub_val) == set(val) & set(subset) and set(sub_train) == set(train) & set(subset)
    assert split_files(list(reversed(files))) == (list(reversed(train)), list(reversed(val)))


def test_split_is_machine_independent(tmp_path):
    # the same relative paths under another root (another machine) land on the same side
    files = stdlib_files()[:300]
    rel = [p.relative_to(stdlib_root()) for p in files]
    moved = [tmp_path / r for r in rel]
    _, val = split_files(files, val_fraction=0.2)
    _, moved_val = split_files(moved, val_fraction=0.2, root=tmp_path)
    assert [p.relative_to(tmp_path) for p in moved_val] == [p.relative_to(stdlib_root()) for p in val]
    assert split_files(files, 0.0)[1] == [] and split_files(files, 1.0)[0] == []


# ---------------------------------------------------------------- exact duplicates

def test_dedup_exact():
    docs = ["a = 1\nb = 2\n", "a = 1   \r\nb = 2\n\n\n", "a = 1\nb = 3\n", " a = 1\nb = 2\n", "a = 1\nb = 3"]
    kept, removed = dedup_exact(docs)
    # trailing whitespace, CRLF and trailing blank lines are ignored; leading indentation is not
    assert removed == [1, 4] and kept == [docs[0], docs[2], docs[3]]
    assert dedup_exact([]) == ([], [])


# ---------------------------------------------------------------- MinHash

def test_mulmod_matches_python_ints():
    rng = random.Random(0)
    a = [rng.randrange(P61) for _ in range(2000)] + [P61 - 1, 0, 1, (1 << 32) - 1, 1 << 32]
    x = [rng.randrange(P61) for _ in range(2000)] + [P61 - 1, P61 - 1, P61 - 1, (1 << 32) - 1, (1 << 60) + 5]
    got = _mulmod_p(np.array(a, dtype=np.uint64), np.array(x, dtype=np.uint64))
    assert got.tolist() == [(u * v) % P61 for u, v in zip(a, x)]


def test_shingles_are_word_kgrams():
    assert shingles("a b  c\n d\te f", k=5) == {"a b c d e", "b c d e f"}
    assert shingles("a b", k=5) == {"a b"} and shingles("  ", k=5) == set()


@pytest.mark.parametrize("num_perm", [128, 256])
@pytest.mark.parametrize("overlap", [0, 100, 500, 800, 1000])
def test_minhash_estimates_jaccard(num_perm, overlap):
    # A = {0..999}, B = {1000-overlap .. 1999-overlap}: exact Jaccard = overlap / (2000 - overlap)
    a = {f"s{i}" for i in range(1000)}
    b = {f"s{i}" for i in range(1000 - overlap, 2000 - overlap)}
    exact = len(a & b) / len(a | b)
    errors = []
    for seed in range(5):
        mh = MinHash(num_perm, seed)
        errors.append(estimate_jaccard(mh.signature(a), mh.signature(b)) - exact)
    bound = SIGMAS * math.sqrt(exact * (1 - exact) / num_perm) + 1 / num_perm
    assert max(map(abs, errors)) <= bound, (exact, errors)
    # unbiased: the mean of 5 seeds is closer still
    assert abs(np.mean(errors)) <= SIGMAS * math.sqrt(exact * (1 - exact) / (5 * num_perm)) + 1 / num_perm


def test_minhash_deterministic_by_seed():
    s = shingles(" ".join(f"w{i}" for i in range(200)))
    assert np.array_equal(MinHash(64, 3).signature(s), MinHash(64, 3).signature(s))
    assert not np.array_equal(MinHash(64, 3).signature(s), MinHash(64, 4).signature(s))
    assert MinHash(64).signature(s).dtype == np.uint64 and MinHash(64).signature(s).shape == (64,)


def test_lsh_params():
    assert lsh_params(128, 0.8) == (16, 8)  # S-curve midpoint (1/16)^(1/8) = 0.71 <= 0.8
    for num_perm, t in [(128, 0.5), (128, 0.9), (100, 0.8)]:
        b, r = lsh_params(num_perm, t)
        assert b * r == num_perm and (1 / b) ** (1 / r) <= t


def perturb(text: str, rng: random.Random, fraction: float) -> str:
    """Delete a few lines and insert a comment: a near-copy, as a vendored or edited file would be."""
    lines = text.split("\n")
    kept = [line for line in lines if rng.random() > fraction]
    kept.insert(len(kept) // 2, "# vendored copy, lightly edited")
    return "\n".join(kept)


def test_near_duplicates_finds_planted_copies_only():
    rel = ["json/encoder.py", "json/decoder.py", "textwrap.py", "heapq.py", "bisect.py", "shlex.py", "fnmatch.py",
           "glob.py", "string.py", "colorsys.py", "abc.py", "copy.py", "functools.py", "contextlib.py", "queue.py",
           "sched.py", "base64.py", "csv.py", "difflib.py", "getopt.py", "gettext.py", "hmac.py", "netrc.py",
           "numbers.py", "operator.py", "pprint.py", "random.py", "reprlib.py", "selectors.py", "statistics.py"]
    docs = read_corpus([stdlib_root() / r for r in rel])
    rng = random.Random(0)
    planted = {}
    for src in (2, 11, 25):
        planted[(src, len(docs))] = None
        docs.append(perturb(docs[src], rng, 0.02))
    pairs = near_duplicates(docs, threshold=0.8)
    assert pairs == sorted(planted)
    for i, j in pairs:  # the planted copies are well above the threshold, by exact Jaccard too
        a, b = shingles(docs[i]), shingles(docs[j])
        assert len(a & b) / len(a | b) > 0.85


def test_near_duplicates_threshold_and_empty():
    words = [f"w{i}" for i in range(400)]
    base = " ".join(words)
    half = " ".join(words[:200] + [f"x{i}" for i in range(200)])  # Jaccard ~ 0.33
    assert near_duplicates([base, half]) == []
    assert near_duplicates([base, half], threshold=0.2, bands=64, rows=2) == [(0, 1)]  # P(candidate) > 0.999
    assert near_duplicates([]) == []


# ---------------------------------------------------------------- packing

@pytest.mark.parametrize("block_size", [1, 4, 7, 100])
def test_pack_lengths_and_no_token_lost(block_size):
    rng = random.Random(block_size)
    docs = [[rng.randrange(1, 50) for _ in range(rng.randrange(0, 30))] for _ in range(20)]
    eos = 0
    stream = [t for d in docs for t in d + [eos]]
    blocks = pack(docs, block_size, eos)
    n = (len(stream) - 1) // block_size
    assert blocks.dtype == torch.long and blocks.shape == (n, block_size + 1)
    # inputs of all blocks, in order, are the stream without its tail; targets are shifted by one
    assert blocks[:, :-1].reshape(-1).tolist() == stream[: n * block_size]
    assert blocks[:, 1:].reshape(-1).tolist() == stream[1: n * block_size + 1]
    assert len(stream) - (n * block_size + 1) < block_size  # only a tail shorter than a block is lost
    assert blocks[:, :-1].eq(eos).sum() == stream[: n * block_size].count(eos)


def test_pack_small_inputs():
    assert pack([], 4, 0).shape == (0, 5)
    assert pack([[1, 2]], 4, 0).shape == (0, 5)  # 3 tokens: not one full block
    assert pack([[1, 2, 3]], 3, 0).tolist() == [[1, 2, 3, 0]]


# ---------------------------------------------------------------- sharded loading

class _Sized(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@pytest.mark.parity
@pytest.mark.parametrize("n,world_size", [(10, 1), (10, 3), (11, 4), (2, 5), (64, 8)])
@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (True, True), (False, False)])
def test_shards_equal_distributed_sampler(n, world_size, shuffle, drop_last):
    for seed, epoch in [(0, 0), (0, 1), (7, 3)]:
        union = []
        for rank in range(world_size):
            ref = DistributedSampler(_Sized(n), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                     seed=seed, drop_last=drop_last)
            ref.set_epoch(epoch)
            ours = ShardSampler(n, rank, world_size, seed, epoch, shuffle, drop_last)
            assert list(ours) == list(ref) and len(ours) == len(ref)
            union += list(ours)
        if not drop_last and n >= world_size:  # every index, each once, plus at most world_size-1 repeats
            assert set(union) == set(range(n)) and len(union) - n < world_size


def test_loader_shards_are_disjoint_and_cover():
    blocks = pack([list(range(1, 400))], 8, 0)  # 50 blocks, first token of block k is 8k+1
    seen = []
    for rank in range(4):
        batches = list(make_loader(blocks, batch_size=5, rank=rank, world_size=4, seed=1, drop_last=True))
        for x, y in batches:
            assert x.shape[1] == y.shape[1] == 8 and torch.equal(x[:, 1:], y[:, :-1])
            seen += x[:, 0].tolist()
    assert len(seen) == len(set(seen)) == 48  # 50 blocks, 2 dropped so 4 ranks get 12 each


def test_loader_deterministic_and_resumable():
    blocks = pack([list(range(1, 800))], 4, 0)
    first = lambda loader: [x[:, 0].tolist() for x, _ in loader]  # noqa: E731
    full = first(make_loader(blocks, 6, rank=1, world_size=2, seed=3, epoch=2))
    assert full == first(make_loader(blocks, 6, rank=1, world_size=2, seed=3, epoch=2))
    assert full != first(make_loader(blocks, 6, rank=1, world_size=2, seed=3, epoch=3))
    for k in (0, 1, 5, len(full)):
        assert first(make_loader(blocks, 6, rank=1, world_size=2, seed=3, epoch=2, start_batch=k)) == full[k:]
    assert first(make_loader(blocks, 6, shuffle=False))[0] == [1, 5, 9, 13, 17, 21]


# ---------------------------------------------------------------- random windows (get_batch)

def nanogpt_get_batch(data: torch.Tensor, batch_size: int, block_size: int, generator):
    """The reference: nanoGPT's train.py get_batch, with an explicit generator."""
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + block_size].long() for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size].long() for i in ix])
    return x, y


@pytest.mark.parity
@pytest.mark.parametrize("kind", ["tensor", "numpy", "memmap"])
def test_get_batch_equals_nanogpt_on_every_container(kind, tmp_path):
    data = np.random.default_rng(0).integers(0, 50_000, size=1000).astype(np.uint16)
    if kind == "tensor":
        tokens = torch.from_numpy(data.astype(np.int32))
    elif kind == "numpy":
        tokens = data
    else:
        data.tofile(tmp_path / "tokens.bin")
        tokens = np.memmap(tmp_path / "tokens.bin", dtype=np.uint16, mode="r")
    x, y = get_batch(tokens, 6, 17, "cpu", torch.Generator().manual_seed(3))
    ref_x, ref_y = nanogpt_get_batch(torch.from_numpy(data.astype(np.int64)), 6, 17, torch.Generator().manual_seed(3))
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (6, 17)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y), kind
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens


def test_get_batch_reaches_every_offset_and_only_valid_ones():
    tokens = torch.arange(12)
    starts = set()
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        x, y = get_batch(tokens, 4, 5, generator=g)
        starts.update(x[:, 0].tolist())
        assert torch.equal(x, x[:, :1] + torch.arange(5)) and torch.equal(y, x + 1)
    assert starts == set(range(12 - 5)), sorted(starts)  # the last window ends on the last token


def test_get_batch_seeded_generator_is_reproducible_and_device_respected():
    tokens = np.arange(100, dtype=np.int32)
    a = get_batch(tokens, 3, 8, "cpu", torch.Generator().manual_seed(7))
    b = get_batch(tokens, 3, 8, torch.device("cpu"), torch.Generator().manual_seed(7))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and a[0].device.type == "cpu"


@pytest.mark.parametrize("args", [(np.arange(5), 1, 5), (np.arange(10), 0, 3), (np.arange(10), 2, 0),
                                  (np.zeros((4, 4)), 1, 2)])
def test_get_batch_rejects_impossible_requests(args):
    with pytest.raises(ValueError):
        get_batch(*args)


BIG_FILE_GIB, DATA_LIMIT_MIB = 4, 256


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA on mmap and /proc are Linux's")
def test_get_batch_samples_a_memmap_far_larger_than_the_memory_limit(tmp_path):
    """A sparse 4 GiB token file (2^31 uint16 tokens, no disk used) sampled in a process whose
    private memory is capped at 256 MiB (RLIMIT_DATA). RLIMIT_AS cannot be used: it counts the
    file's mapping itself, which takes address space but no memory. The child proves the cap
    bites (copying 400 MB of the file raises MemoryError), then draws batches, which read only
    their windows: its private resident memory (RssAnon) grows by less than 32 MiB. (Total RSS
    also counts the file pages the kernel maps around each window, readahead that the kernel
    may drop at any time, so it is not the measure.)"""
    path = tmp_path / "tokens.bin"
    with open(path, "wb") as f:
        f.truncate(BIG_FILE_GIB << 30)
        f.seek((BIG_FILE_GIB << 30) - 8)
        f.write(np.array([1, 2, 3, 4], dtype=np.uint16).tobytes())  # the last 4 tokens are known
    child = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_DATA, ({DATA_LIMIT_MIB} << 20, {DATA_LIMIT_MIB} << 20))
        import numpy as np, torch
        from camplib.data import get_batch
        tokens = np.memmap({str(path)!r}, dtype=np.uint16, mode="r")
        assert len(tokens) == {BIG_FILE_GIB} << 29
        try:
            np.array(tokens[:200_000_000])
            raise SystemExit("the memory limit does not bite: the test proves nothing")
        except MemoryError:
            pass
        def rss_anon_kib():
            line = next(l for l in open("/proc/self/status") if l.startswith("RssAnon:"))
            return int(line.split()[1])
        before = rss_anon_kib()
        g = torch.Generator().manual_seed(0)
        for _ in range(50):
            x, y = get_batch(tokens, 32, 256, "cpu", g)
            assert x.shape == (32, 256) and x.dtype == torch.int64
        x, y = get_batch(tokens[-6:], 1, 5, "cpu", g)  # a view of the tail: the known tokens
        assert x.tolist() == [[0, 0, 1, 2, 3]] and y.tolist() == [[0, 1, 2, 3, 4]], (x, y)
        grown = (rss_anon_kib() - before) / 1024
        assert grown < 32, f"private memory grew by {{grown:.0f}} MiB"
        print("ok", round(grown, 1))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr
