"""Arguments checked before anything heavy is imported: a mistyped model, detector, method or metric name
is refused in well under a second, with the closest valid names, instead of after the 2-10 s that importing
torch and transformers takes.

Torch-free by design (``tests/cli/test_fast_refusals.py`` checks that torch is not in ``sys.modules`` at
the refusal): the names come from :mod:`headlens.zoo.names`, the torch-free lists the registries themselves check against,
the model reference from :func:`headlens.models.loading.check_reference`. What can only be told with the
model loaded (a detector the model cannot support, a head out of range) is still the command's to check.
"""

from __future__ import annotations

from collections.abc import Sequence

from headlens.cli.options import check_choice


def check_model(ref: str | None) -> None:
    """Refuse a reference that cannot name a model (exit 4), e.g. ``induction2l`` (did you mean 'induction-2l')."""
    from headlens.models.loading import check_reference

    check_reference(ref)


def check_detectors(text: str | None) -> None:
    """Refuse an unknown built-in detector name (exit 6). ``module:attribute`` references and, when detector
    plugins are installed, names the built-ins lack are left to the registry (a plugin may define them). Once
    the registry is imported (a caller in the same process), the names it holds count too."""
    if not text:
        return
    import sys

    from headlens.zoo.names import DETECTORS, RENAMED, base_name, split_names, unknown_detector

    registry = sys.modules.get("headlens.detectors")  # detectors registered in this process (register_detector)
    known = list(getattr(registry, "DETECTORS", DETECTORS))
    for name in split_names(text):
        base = base_name(name)
        if base in known or base in RENAMED or (":" in name and base == name):  # old names map, with a warning
            continue
        if _has_plugins():
            return
        raise unknown_detector(base, known)


def check_names(option: str, text: str, names: Sequence[str], keep: str | None = None) -> None:
    """Refuse (exit 2) a comma-separated ``option`` value with a name outside ``names``; a name starting with
    ``keep`` (``receiver:``) is someone else's to check."""
    for name in filter(None, (n.strip() for n in text.split(","))):
        if keep is None or not name.startswith(keep):
            check_choice(option, name, names)


def _has_plugins() -> bool:
    from importlib.metadata import entry_points

    from headlens.zoo.names import ENTRY_POINT_GROUP

    return bool(entry_points(group=ENTRY_POINT_GROUP))
