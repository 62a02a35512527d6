"""A CPU-only torch that forks like a CUDA build on a GPU machine: `register()` makes torch's
autograd engine count one accelerator.

At the first backward in a process, torch's engine starts a thread per device of every
registered device guard other than CPU, Meta and Lazy (Engine::start_device_threads) and, when
it counts at least one, registers a pthread_atfork handler that marks every child forked after
that (track_bad_autograd_forks); a backward in a marked child raises "Unable to handle
autograd's threading in combination with fork-based multiprocessing". A CPU-only build counts no
device, so a lab that ran backward in its notebook and then forked ranks passed here and failed
on an H200. `register()` installs a Python device guard for PrivateUse1 counting one device
(torch's own hook for backends written in Python, torch.utils.backend_registration); nothing
else changes (torch.accelerator still finds none, tensors stay on the CPU).

It cannot be undone: call it in a forked child or a notebook kernel, never in a pytest worker
(later tests there would fork marked ranks). `kernel_startup(folder)` returns an IPYTHONDIR whose
startup file registers it in every kernel started with that environment; `registered_in(folder)`
says whether a kernel did (a startup file that failed would otherwise only print to the kernel's
log, and the check would pass without having run).
"""
from pathlib import Path

import torch

_GUARDS = []  # the registry holds the guard; keep it alive for the process's life


class _OneAcceleratorGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register() -> None:
    if not _GUARDS:
        _GUARDS.append(_OneAcceleratorGuard())
        torch._C._acc.register_python_privateuseone_device_guard(_GUARDS[0])


def kernel_startup(folder: Path) -> Path:
    """An IPYTHONDIR under `folder` whose profile's startup registers the fake accelerator, as
    this module loaded by path under the name `camp_fake_accelerator` (the kernel cannot import
    `tests`); nothing lands in the notebook's namespace."""
    startup = Path(folder) / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-fake-accelerator.py").write_text(
        "def _camp_fake_accelerator():\n"
        "    import importlib.util, sys\n"
        f"    spec = importlib.util.spec_from_file_location('camp_fake_accelerator', {str(Path(__file__))!r})\n"
        "    module = sys.modules['camp_fake_accelerator'] = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    module.register()\n"
        f"    open({str(Path(folder) / 'ipython' / 'registered')!r}, 'w').close()\n"
        "_camp_fake_accelerator()\n"
        "del _camp_fake_accelerator\n")
    return Path(folder) / "ipython"


def registered_in(folder: Path) -> bool:
    return (Path(folder) / "ipython" / "registered").exists()
