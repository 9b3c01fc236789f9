"""The case list is h2spec's: every section with as many cases as h2spec has, each id once."""

from __future__ import annotations

import collections

from tests.h2conformance.cases import CASES

#: h2spec's sections and their numbers of cases (its ``generic/``, ``http2/`` and ``hpack/`` sources).
SECTIONS = {
    "generic/1": 1,
    "generic/2": 5,
    "generic/3.1": 3,
    "generic/3.2": 3,
    "generic/3.3": 5,
    "generic/3.4": 1,
    "generic/3.5": 1,
    "generic/3.7": 1,
    "generic/3.8": 1,
    "generic/3.9": 2,
    "generic/3.10": 2,
    "generic/4": 4,
    "generic/5": 15,
    "http2/3.5": 2,
    "http2/4.1": 3,
    "http2/4.2": 3,
    "http2/4.3": 3,
    "http2/5.1": 13,
    "http2/5.1.1": 2,
    "http2/5.1.2": 1,
    "http2/5.3.1": 2,
    "http2/5.4.1": 2,  # the second only with h2spec --strict
    "http2/5.5": 2,
    "http2/6.1": 3,
    "http2/6.2": 4,
    "http2/6.3": 2,
    "http2/6.4": 3,
    "http2/6.5": 3,
    "http2/6.5.2": 5,
    "http2/6.5.3": 2,
    "http2/6.7": 4,
    "http2/6.8": 1,
    "http2/6.9": 3,
    "http2/6.9.1": 3,
    "http2/6.9.2": 3,
    "http2/6.10": 6,
    "http2/7": 2,
    "http2/8.1": 1,
    "http2/8.1.2": 1,
    "http2/8.1.2.1": 4,
    "http2/8.1.2.2": 2,
    "http2/8.1.2.3": 7,
    "http2/8.1.2.6": 2,
    "http2/8.2": 1,
    "hpack/2.3.3": 2,
    "hpack/4.2": 1,
    "hpack/5.2": 3,
    "hpack/6.1": 1,
    "hpack/6.3": 1,
}


def test_every_h2spec_case_is_here_once() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) == sum(SECTIONS.values()) == 146 + 1
    found = collections.Counter(i.rsplit("/", 1)[0] for i in ids)
    assert found == SECTIONS
    for section, count in SECTIONS.items():
        numbers = [int(i.rsplit("/", 1)[1]) for i in ids if i.rsplit("/", 1)[0] == section]
        assert numbers == list(range(1, count + 1)), section


def test_only_the_reference_servers_known_failure_is_marked() -> None:
    assert [case.id for case in CASES if case.reference_xfail] == ["http2/5.1.1/2"]
