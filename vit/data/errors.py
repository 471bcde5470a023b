"""The data faults a user can cause, as one type, so that train.py prints their one line instead of a traceback."""


class DataError(ValueError):
    """Data that cannot be used as given (a malformed file, a key out of range); the message names the file or key."""
