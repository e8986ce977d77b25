"""Every public name exported by ``everyo`` has a docstring (the add-ons' cells check their ``__all__``)."""

import inspect

import everyo as eo


def undocumented(module, names):
    missing = []
    for name in names:
        try:
            obj = getattr(module, name)
        except ImportError:
            continue  # an add-on's name, not installed in this cell: its own cell checks it
        if inspect.ismodule(obj) or not callable(obj):
            continue  # submodules have their own docstrings; constants cannot carry one
        doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
        if not (doc and doc.strip()):
            missing.append(name)
    return missing


def test_every_public_name_of_everyo_has_a_docstring():
    assert undocumented(eo, [n for n in dir(eo) if not n.startswith("_")]) == []
