"""Device profiles: published figures with their sources, sane magnitudes, JSON round trips,
and typed errors for names and files that cannot be used."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.twin import (
    PROFILES,
    DeviceProfile,
    ProfileError,
    ProfileFileError,
    UnknownProfileError,
    get_profile,
    load_profile,
)
from engine.twin.profiles import FACTOR_FIELDS

GPUS = ("h100-pcie", "h100-sxm", "mi300x", "rx9070xt")


def test_the_issue_asks_for_these_profiles():
    assert sorted(PROFILES) == ["cpu-here", "h100-pcie", "h100-sxm", "mi300x", "rx9070xt"]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_published_figure_cites_its_source(name):
    profile = get_profile(name)
    cited = {s.field: s for s in profile.sources}
    for field in profile.published_fields():
        assert field in cited, f"{name}.{field} is published but cites no source"
        assert cited[field].title and cited[field].figure
    for field in profile.fitted:  # each says whether it is fitted, assumed or a placeholder
        assert field in cited, f"{name}.{field} is fitted but says nothing of where from"


@pytest.mark.parametrize("name", GPUS)
def test_gpu_figures_come_from_vendor_pages_and_factors_are_marked_assumed(name):
    profile = get_profile(name)
    for source in profile.sources:
        if source.field in profile.published_fields():
            assert source.url.startswith("https://"), source
    assert set(FACTOR_FIELDS) <= set(profile.fitted)
    assert "memory_bandwidth_bytes_s" not in profile.fitted
    assert "fp16_flops_s" not in profile.fitted


def test_published_magnitudes():
    names = ("h100-sxm", "h100-pcie", "mi300x", "rx9070xt")
    sxm, pcie, mi300x, card = (get_profile(name) for name in names)
    assert (sxm.memory_bytes, sxm.memory_bandwidth_bytes_s) == (80e9, 3.35e12)
    assert (pcie.memory_bytes, pcie.memory_bandwidth_bytes_s) == (80e9, 2.0e12)
    assert (mi300x.memory_bytes, mi300x.memory_bandwidth_bytes_s) == (192e9, 5.3e12)
    assert (card.memory_bytes, card.memory_bandwidth_bytes_s) == (16e9, 640e9)
    # Dense figures: half of what the vendors quote with sparsity.
    assert sxm.fp16_flops_s == pytest.approx(1979e12 / 2, rel=1e-3)
    assert pcie.fp16_flops_s == pytest.approx(1513e12 / 2, rel=1e-3)
    assert card.int4_ops_s == pytest.approx(1557e12 / 2, rel=1e-3)
    assert mi300x.fp16_flops_s == pytest.approx(1307.4e12)
    for profile in (sxm, pcie, mi300x, card):
        assert profile.fp32_flops_s < profile.fp16_flops_s <= profile.int8_ops_s
        assert profile.host_link_bandwidth_bytes_s == 64e9  # PCIe 5.0 x16, one direction
        assert profile.copies_overlap_compute


def test_cpu_here_is_a_placeholder_until_fitted():
    cpu = get_profile("cpu-here")
    assert not cpu.copies_overlap_compute
    figures = ("memory_bandwidth_bytes_s", "fp32_flops_s", "host_link_bandwidth_bytes_s")
    assert set(figures) | set(FACTOR_FIELDS) <= set(cpu.fitted)
    assert all(s.title == "placeholder until fitted" for s in cpu.sources if s.field in figures)


def test_flops_for_a_width_falls_back_to_the_next_wider_published_kind():
    card, sxm = get_profile("rx9070xt"), get_profile("h100-sxm")
    assert card.flops_s(4) == card.int4_ops_s
    assert sxm.flops_s(4) == sxm.int8_ops_s  # Hopper publishes no INT4 figure
    assert sxm.flops_s(16) == sxm.fp16_flops_s and sxm.flops_s(32) == sxm.fp32_flops_s


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_json_round_trip(name, tmp_path):
    profile = get_profile(name)
    path = tmp_path / f"{name}.json"
    profile.save(path)
    assert load_profile(path) == profile


def test_a_refitted_profile_round_trips(tmp_path):
    refit = dataclasses.replace(
        get_profile("rx9070xt"),
        memory_efficiency=0.713,
        step_overhead_s=0.0042,
        prefill_context_passes=2.25,
    )
    refit.save(tmp_path / "refit.json")
    assert load_profile(tmp_path / "refit.json") == refit


def test_a_profile_file_from_before_the_prefill_reread_factor_loads_without_it(tmp_path):
    # Files fitted before the factor existed predict as they did: no re-read beyond the
    # roofline. The factor is listed with the others a fit sets.
    assert "prefill_context_passes" in FACTOR_FIELDS
    fitted = dataclasses.replace(get_profile("cpu-here"), attention_efficiency=0.4)
    data = fitted.to_json()
    del data["prefill_context_passes"]
    loaded = load_profile(_write(tmp_path, json.dumps(data)))
    assert loaded.prefill_context_passes == 0.0 and loaded == fitted


@pytest.mark.parametrize("name", GPUS)
def test_a_gpu_profile_assumes_no_prefill_rereads_and_says_so(name):
    profile = get_profile(name)
    assert profile.prefill_context_passes == 0.0
    cited = [s.title for s in profile.sources if s.field == "prefill_context_passes"]
    assert cited == ["assumed until fitted"]


def test_a_negative_number_of_passes_is_refused(tmp_path):
    data = get_profile("cpu-here").to_json()
    data["prefill_context_passes"] = -0.5
    with pytest.raises(ProfileFileError, match="prefill_context_passes must be finite"):
        load_profile(_write(tmp_path, json.dumps(data)))


def test_unknown_name_lists_the_shipped_ones():
    with pytest.raises(UnknownProfileError, match="rx9070xt") as caught:
        get_profile("rx9070")
    assert caught.value.name == "rx9070" and "load_profile" in str(caught.value)


def _write(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not readable as JSON"),
        ("[1, 2]", "holds a list"),
        (json.dumps({"name": "x"}), "not a device profile"),
    ],
)
def test_bad_files_raise_a_typed_error(tmp_path, text, match):
    with pytest.raises(ProfileFileError, match=match):
        load_profile(_write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(ProfileFileError, match="no such file"):
        load_profile(tmp_path / "absent.json")


def test_a_file_with_an_impossible_figure_names_it(tmp_path):
    data = get_profile("rx9070xt").to_json()
    data["memory_bandwidth_bytes_s"] = -1
    with pytest.raises(ProfileFileError, match="memory_bandwidth_bytes_s must be"):
        load_profile(_write(tmp_path, json.dumps(data)))


def test_fitted_and_sources_name_real_fields():
    with pytest.raises(ProfileError, match="memory_bandwith"):
        dataclasses.replace(get_profile("mi300x"), fitted=("memory_bandwith",))
    assert isinstance(get_profile("mi300x"), DeviceProfile)
