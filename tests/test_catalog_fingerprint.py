"""The selftest's case catalog builds the problems and expects the answers it did when tests/catalog_fingerprints.json
was recorded (tests/catalog_fingerprint.py): each case's op, name and dtype, a hash of its inputs at seed 0 and
a hash of its reference outputs, family by family, at the tiny and quick profiles. A restructuring of the catalog
(issue 50: one catalog language) must leave every row as it was; a deliberate change of cases records them
again (`python tests/catalog_fingerprint.py --write`) and says why in its commit.

Reference outputs are float arithmetic: recorded with torch as CI installs it, and compared only under the same
version (another torch may round a reduction differently)."""

import pytest
import torch

from catalog_fingerprint import PROFILES, families, fingerprints, recorded

RECORD = recorded()


@pytest.mark.skipif(torch.__version__ != RECORD["torch"], reason=f"recorded with torch {RECORD['torch']}")
@pytest.mark.parametrize("family", list(families()))
@pytest.mark.parametrize("profile", PROFILES)
def test_every_case_builds_and_expects_what_was_recorded(profile, family):
    want = RECORD["cases"][profile].get(family)
    assert want is not None, f"{family} has no record at {profile}: record it (tests/catalog_fingerprint.py --write)"
    got = fingerprints(profile, family)
    changed = [f"{g[0]} {g[1]} {g[2]}" for g, w in zip(got, want) if g != w]
    assert len(got) == len(want) and not changed, (
        f"{len(got)} cases, {len(want)} recorded; first changed: {changed[:5]}")


def test_the_fingerprint_sees_a_changed_value():
    base = {"x": torch.arange(6.0).view(2, 3), "k": 3, "pages": [torch.zeros(2, dtype=torch.int32)]}
    from catalog_fingerprint import hashed

    assert hashed(base) == hashed({**base, "x": torch.arange(6.0).view(2, 3)})
    assert hashed(base) != hashed({**base, "x": torch.arange(6.0).view(3, 2)})  # shape
    assert hashed(base) != hashed({**base, "k": 4})  # a Python parameter
    nudged = torch.arange(6.0).view(2, 3)
    nudged[1, 2] = torch.nextafter(nudged[1, 2], torch.tensor(10.0))  # one ulp
    assert hashed(base) != hashed({**base, "x": nudged})


def test_the_judgement_sees_a_lost_check_and_a_wider_tolerance():
    from catalog_fingerprint import judgement
    from specdec_kernels.selftest.compare import close, expect, with_checks
    from specdec_kernels.selftest.model import Case

    want, inputs = (torch.tensor([1.0, 2.0]),), {"x": torch.zeros(2)}

    def case(compare):
        return Case("op", "name", torch.float32, lambda seed: inputs, lambda x, be: want, compare)

    base = close(("out",), ((1e-3, 1e-3),))
    checked = with_checks(base, expect("out[0] == 1", lambda got, x: bool(got[0][0] == 1)))
    assert judgement(case(checked), want, inputs) == judgement(case(checked), want, inputs)
    assert judgement(case(checked), want, inputs) != judgement(case(base), want, inputs)  # the check's verdict
    assert judgement(case(base), want, inputs) != judgement(case(close(("out",), ((1.0, 1.0),))), want, inputs)
