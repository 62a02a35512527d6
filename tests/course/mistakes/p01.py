"""Typical mistakes in lab p01: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "p01")


MISTAKES = [
    # FIM in PMS order: the middle before the suffix, so the model never learns to use the suffix
    # (the short pretraining still works: only the layout test fails)
    Mistake("fim", _edit("fim", 'return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}{middle}"',
                         'return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{middle}{FIM_MIDDLE}{suffix}"'),
            3, "MIDDLE last"),
    # perplexity from the summed loss: grows with the length of the text
    Mistake("perplexity", _edit("perplexity", "return math.exp(float(token_losses.double().mean()))",
                                "return math.exp(float(token_losses.double().sum()))"),
            2, "the MEAN loss"),
    # strip() instead of rstrip(): indentation, which is Python syntax, no longer counts
    Mistake("next_line", _edit("next_line", 'first = lambda text: text.split("\\n", 1)[0].rstrip()',
                               'first = lambda text: text.split("\\n", 1)[0].strip()'),
            2, "indentation counts"),
    # reports but never asks the pruner: no trial is ever stopped early
    Mistake("objective", _edit("objective", "        if trial.should_prune():\n            raise optuna.TrialPruned()\n", "        pass\n"),
            3, "trial.should_prune()"),
    # pass@k as the share of samples that passed: ignores k (right for k = 1 only)
    Mistake("passk", _edit("passk", "    if n - c < k:\n        return 1.0\n    product = 1.0", "    return c / n\n    product = 1.0"),
            2, "you returned c / n"),
    # pass@k as if samples were drawn with replacement: biased low
    Mistake("passk", _edit("passk", "    if n - c < k:\n        return 1.0\n    product = 1.0",
                           "    return 1.0 - (1.0 - c / n) ** k\n    product = 1.0"),
            2, "biased low"),
    # the completion runs on past the end of its line: the program repeats the code after the gap
    Mistake("passk", _edit("passk", 'return bpe.decode(out).split("\\n", 1)[0]', "return bpe.decode(out)"),
            2, "up to the first newline"),
]
