"""Exceptions the client raises. Every one says what happened and carries what the caller needs to act."""


class SetpoError(Exception):
    """Base class: catch this to handle any failure of a setpo call. `replica`: the base URL of the replica at
    fault when one is (an error answer, an answer off the contract), so a caller can ask another."""

    replica: str | None = None


class SetpoAPIError(SetpoError):
    """The server answered with an error. `message` is the server's own words; `param` names the field."""

    def __init__(self, status: int, message: str, type: str = "", param: str | None = None):
        where = f" [{param}]" if param else ""
        super().__init__(f"setpo server answered {status}{where}: {message}")
        self.status, self.message, self.type, self.param = status, message, type, param


class SetpoConnectionError(SetpoError):
    """The server could not be reached (or dropped the connection), after every retry."""


class SetpoTimeoutError(SetpoError):
    """The server took longer than the client's timeout to answer. Not retried: the work may still be running."""
