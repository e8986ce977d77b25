"""Every public name exported by ``everyo`` has a docstring (the add-ons' cells check their ``__all__``)."""

import everyo as eo
from everyo.testing import undocumented_public_api


def test_every_public_name_of_everyo_has_a_docstring():
    assert undocumented_public_api(eo, [n for n in dir(eo) if not n.startswith("_")]) == []


def test_the_check_finds_a_missing_docstring():
    import types

    module = types.ModuleType("everyo.fake")

    def documented():
        """Has one."""

    def bare():
        pass

    module.documented, module.bare, module.CONSTANT = documented, bare, 3
    module.__all__ = ["documented", "bare", "CONSTANT"]
    assert undocumented_public_api(module) == ["bare"]
