"""LLM Camp's course tooling: the `camp` command (list, build, run, grade, check) and the
checking helper that every lab's graded tests call (`autograder.checks`)."""
