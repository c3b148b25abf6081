"""The one kind of failure setpo-eval reports as a sentence rather than a traceback."""


class InputError(Exception):
    """Something the user gave cannot be used: a file that is not there or not as expected, an unknown dataset, a
    model that does not load, a flag the chosen backend would ignore. The message is one sentence saying which and
    what to do; `setpo-eval` prints it and exits 2, as argparse does for a bad flag."""
