"""The step's contracts (pipeline/decode/interfaces.py) hold for both sides of the process boundary: the local
verifier and draft (the serial engine) and the channel verifier and draft link (the actor pipeline) each have every
method of their Protocol, with its parameters in order, by name, kind and default."""
from __future__ import annotations

import inspect

import pytest

from pipeline.decode.deferred import ChannelVerifier, DraftLink
from pipeline.decode.interfaces import Drafter, Verifier
from pipeline.decode.local import LocalDraft, LocalVerifier


def _methods(protocol) -> list[str]:
    return [name for name, member in vars(protocol).items() if inspect.isfunction(member) and not name.startswith("_")]


def _parameters(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("protocol, implementation", [(Verifier, LocalVerifier), (Verifier, ChannelVerifier),
                                                      (Drafter, LocalDraft), (Drafter, DraftLink)],
                         ids=lambda c: c.__name__)
def test_each_implementation_has_its_contracts_methods_with_the_same_parameters(protocol, implementation):
    assert issubclass(implementation, protocol)
    assert _methods(protocol), protocol
    for name in _methods(protocol):
        assert _parameters(getattr(implementation, name)) == _parameters(getattr(protocol, name)), \
            f"{implementation.__name__}.{name}{inspect.signature(getattr(implementation, name))} is not " \
            f"{protocol.__name__}.{name}{inspect.signature(getattr(protocol, name))}"
