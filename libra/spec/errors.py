"""The one error type for invalid specifications: it names the field, the value and what would be valid."""


class SpecError(ValueError):
    """A specification value is invalid or inconsistent with another one."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)
