"""Errors raised on bad input (client files and updates are untrusted)."""


class InputError(ValueError):
    """Bad input: the message names the client and the tensor at fault where there is one."""

    def __init__(self, message: str, *, client: str | None = None, tensor: str | None = None):
        where = ", ".join(
            part for part in (f"client {client!r}" if client is not None else "",
                              f"tensor {tensor!r}" if tensor is not None else "") if part
        )
        super().__init__(f"{where}: {message}" if where else message)
        self.client = client
        self.tensor = tensor


class NoTasksError(InputError):
    """A round has too few informative coordinates (zero in every update there) to form the bonus and penalty
    sets: nothing in it can be scored. A federation records such a round as not scored and goes on."""


class BackendUnavailable(RuntimeError):
    """The backend cannot run where it was asked for (no triton, no GPU, kernels and tensors on different kinds of
    device); the message says why (no silent fallback)."""
