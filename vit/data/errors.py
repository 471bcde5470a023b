"""The data faults a user can cause, as one type, so that train.py prints their one line instead of a traceback."""

WORKER_TRACEBACK = "Original Traceback (most recent call last):"  # torch's re-raise of a DataLoader worker's error


class DataError(ValueError):
    """Data that cannot be used as given (a malformed file, a key out of range); the message names the file or key.

    Raised in a DataLoader worker, torch raises it again in the main process with the worker's whole traceback
    as its message; str() gives back the worker's own line, and says where it came from."""

    def __str__(self) -> str:
        text = super().__str__()
        if WORKER_TRACEBACK not in text:
            return text
        where = text.split(".", 1)[0].removeprefix("Caught DataError ")  # 'in DataLoader worker process 0'
        raised = [line for line in text.splitlines() if line.startswith(f"{__name__}.DataError: ")]
        return f"{raised[-1].split(': ', 1)[1]} ({where})" if raised else text
