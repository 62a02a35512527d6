"""Making a trained model cheaper (lab a08): structured pruning (`pruning`), knowledge
distillation (`distill`) and graph capture with torch.compile / torch.export (`static_graph`).

Each piece changes what runs, not what is computed where it can avoid it: a pruned layer is a
physically smaller Linear (fewer parameters, bytes and FLOPs), not a mask over a dense one.
"""
