"""gp.Hardware.calibrate measures collectives up to tens of MiB by default, time-bounded: the
sizes above calibrate.LARGE run smallest first and stop once a round of them passes
``large_budget_s`` (the larger ones are dropped, extrapolated); they repeat LARGE_REPEAT times
and the fit divides by each probe's own repeat. Probes here are tiny (sizes and LARGE shrunk)."""
import inspect

import pytest

import gspmd_py as gp
from gspmd_py.cost import calibrate

TINY_CONVS = (("small-c/small-hw", 4, 4), ("small-c/large-hw", 8, 4), ("large-c/small-hw", 4, 8),
              ("large-c/large-hw", 8, 8))  # tiny images: labels only


@pytest.fixture
def tiny(monkeypatch):
    for name, v in (("MATMUL_FLOPS", 2 ** 20), ("ELEMS", 2 ** 12), ("MEM_ELEMS", 2 ** 12), ("SUSTAIN", 1),
                    ("MATMULS", calibrate.MATMULS[:1]), ("KINDS", calibrate.KINDS[:3]), ("LARGE", 2 ** 13),
                    ("MATMUL_CLASSES", ((2 ** 20, (1, 16, 16, 16), 2 ** 16),)), ("CONV_FLOPS", 2 ** 14), ("CONV_PROBES", TINY_CONVS)):
        monkeypatch.setattr(calibrate, name, v)
    return gp.Mesh((2, 4), ("x", "y"))


def _sizes(cal):
    return sorted({pr.info[3] for pr in cal.probes if ":" in pr.name})


def test_default_sizes_reach_tens_of_mib():
    for fn in (gp.Hardware.calibrate, calibrate.measure):
        default = inspect.signature(fn).parameters["sizes"].default
        assert min(default) <= 2 ** 14 and max(default) >= 32 * 2 ** 20
        assert inspect.signature(fn).parameters["large_budget_s"].default == calibrate.LARGE_BUDGET_S


def test_large_sizes_stop_at_the_time_budget(tiny):
    sizes = (2 ** 12, 2 ** 14, 2 ** 16)
    cal = calibrate.Calibrator(tiny, sizes)
    assert _sizes(cal) == [2 ** 12]  # the large ones are made when a round first needs them
    assert cal.warm_up(0.0) == (2 ** 12,)  # no time for any large size: dropped, extrapolated
    cal.sample()
    assert _sizes(cal) == [2 ** 12] and all(len(pr.times) == 1 for pr in cal.probes)
    roomy = calibrate.Calibrator(tiny, sizes)
    assert roomy.warm_up(600.0) == sizes
    assert all(not pr.times for pr in roomy.probes)  # the warm-up does not count
    assert {pr.info[4] for pr in roomy.probes if ":" in pr.name and pr.info[3] > calibrate.LARGE} == \
        {calibrate.LARGE_REPEAT}
    unbounded = calibrate.Calibrator(tiny, sizes)
    assert unbounded.warm_up(None) == sizes
    plain = calibrate.Calibrator(tiny, sizes)
    plain.sample()  # no warm-up: every size measured
    assert _sizes(plain) == list(sizes)


def test_bounded_calibration_fits_every_axis(tiny):
    hw = gp.Hardware.calibrate(tiny, sizes=(2 ** 12, 2 ** 14, 2 ** 16), reps=1, large_budget_s=0.0)
    for axis in ("x", "y"):
        lk = hw.topology.link(axis)
        assert lk.alpha >= 0 and lk.beta > 0
