"""chute.collector: the cyclic collector is off inside the block and as it was after."""

import gc

import pytest

from chute import collector as gcpause


@pytest.fixture
def restore_gc():
    before = gc.isenabled()
    yield
    (gc.enable if before else gc.disable)()


def test_paused_inside_and_enabled_after(restore_gc):
    gc.enable()
    with gcpause.paused(collect_first=True):
        assert not gc.isenabled()
    assert gc.isenabled()


def test_enabled_again_after_an_exception(restore_gc):
    gc.enable()
    with pytest.raises(RuntimeError), gcpause.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_left_disabled_when_it_was_disabled(restore_gc):
    gc.disable()
    with gcpause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
