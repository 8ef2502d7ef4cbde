"""Errors a user can act on. Each carries the exit code DESIGN.md assigns and the way out."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the job failed: build, smoke, check
EXIT_INPUT = 2  # bad input: spec, arguments, lockfile
EXIT_ENV = 3  # environment: no Docker daemon, registry unreachable


class ImgbuildError(Exception):
    """A known failure: `facts` lead to the conclusion, `hint` says what to do next."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, facts: list[str] | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.facts = list(facts or [])
        self.hint = hint

    def to_dict(self) -> dict:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "facts": self.facts,
            "hint": self.hint,
            "exit_code": self.exit_code,
        }


class InputError(ImgbuildError):
    """Bad arguments, unknown target or model."""

    exit_code = EXIT_INPUT


class SpecError(InputError):
    """A spec file under images/ is malformed: names the file, the key and what was expected."""

    def __init__(self, path: str, key: str, expected: str, got: object | None = None, *,
                 hint: str | None = None):
        where = f"{path}: {key}" if key else path
        msg = f"{where}: expected {expected}"
        if got is not None:
            msg += f", got {got!r}"
        super().__init__(msg, hint=hint or f"fix {path} and run the command again")
        self.path, self.key, self.expected = path, key, expected


class LockError(InputError):
    """A lockfile is corrupted, hand-edited or cannot be produced from the inputs."""


class ResolveError(ImgbuildError):
    """uv found no resolution; the facts are the chain that leads there."""

    exit_code = EXIT_FAILED


class EnvError(ImgbuildError):
    """The machine lacks something: Docker daemon, registry, uv."""

    exit_code = EXIT_ENV


class JobFailed(ImgbuildError):
    """A build or smoke test ran and failed."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, facts: list[str] | None = None, hint: str | None = None,
                 log_tail: list[str] | None = None):
        super().__init__(message, facts=facts, hint=hint)
        self.log_tail = list(log_tail or [])
