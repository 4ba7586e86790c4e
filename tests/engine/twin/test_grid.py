"""A step-time grid file: what is written is read back whole, and a file that cannot be
a grid is refused with a GridError that names it and says what to do."""

from __future__ import annotations

import json

import pytest

from engine.twin import GRID_VERSION, GridError, ModelShape, StepBatch, StepSample
from engine.twin.grid import load_grid, read_grid, write_grid


def _shape(name: str, *, layers: int, bits: int = 32) -> ModelShape:
    return ModelShape(
        name=name,
        num_layers=layers,
        hidden_size=256,
        intermediate_size=1024,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        vocab_size=1000,
        num_projection_weights=layers * 1_000_000,
        num_parameters=layers * 1_000_000 + 256_000,
        weight_bits=bits,
        activation_bits=32,
    )


TINY = _shape("tiny", layers=4)
DEEP = _shape("deep", layers=32, bits=4)


def _samples() -> list[StepSample]:
    return [
        StepSample(
            device="cpu-here",
            model=TINY,
            batch=StepBatch.from_json([[1, 64], [1, 65], [1, 66]]),
            seconds=0.0123,
            attention="paged",
        ),
        StepSample(
            device="cpu-here",
            model=DEEP,
            batch=StepBatch.from_json([[256, 1024]]),
            seconds=0.5,
            attention="paged",
        ),
        StepSample(
            device="cpu-here",
            model=TINY,
            batch=StepBatch.from_json([[1, 300], [64, 0]]),
            seconds=1e-3,
        ),
    ]


def test_a_grid_reads_back_as_written(tmp_path) -> None:
    path = tmp_path / "sub" / "grid.json"
    recorded = {"torch": "2.x", "device_name": "some CPU", "dtype": "float32"}
    assert write_grid(path, _samples(), recorded=recorded) == path
    assert read_grid(path) == _samples()
    grid = load_grid(path)
    assert grid.device == "cpu-here"
    assert grid.recorded == recorded
    assert grid.model_names == ("tiny", "deep")
    document = json.loads(path.read_text())
    assert document["version"] == GRID_VERSION
    assert set(document["models"]) == {"tiny", "deep"}  # each shape once, samples by name
    assert document["models"]["deep"] == DEEP.to_json()


def test_a_missing_file_is_a_grid_error_naming_it(tmp_path) -> None:
    with pytest.raises(GridError, match="no such file") as caught:
        read_grid(tmp_path / "absent.json")
    assert caught.value.path.endswith("absent.json")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"version": 99}', "version 99"),
        ('{"version": 1, "device": "cpu-here", "models": {}, "samples": []}', "no samples"),
        (
            '{"version": 1, "device": "x", "models": {}, '
            '"samples": [{"model": "gone", "batch": [[1, 1]], "seconds": 0.1}]}',
            "absent from 'models'",
        ),
    ],
)
def test_a_file_that_is_no_grid_is_refused(tmp_path, document: str, problem: str) -> None:
    path = tmp_path / "grid.json"
    path.write_text(document)
    with pytest.raises(GridError, match=problem):
        read_grid(path)


def test_a_non_positive_time_is_refused(tmp_path) -> None:
    path = tmp_path / "grid.json"
    write_grid(path, _samples())
    document = json.loads(path.read_text())
    document["samples"][0]["seconds"] = 0
    path.write_text(json.dumps(document))
    with pytest.raises(GridError, match="positive time"):
        read_grid(path)


def test_one_grid_holds_one_device_and_one_shape_per_name(tmp_path) -> None:
    other = StepSample(
        device="h100-sxm", model=TINY, batch=StepBatch.from_json([[1, 1]]), seconds=1
    )
    with pytest.raises(GridError, match="several devices"):
        write_grid(tmp_path / "g.json", [*_samples(), other])
    renamed = _shape("tiny", layers=8)
    clash = StepSample(device="cpu-here", model=renamed, batch=other.batch, seconds=1)
    with pytest.raises(GridError, match="both named 'tiny'"):
        write_grid(tmp_path / "g.json", [*_samples(), clash])
    with pytest.raises(GridError, match="no samples"):
        write_grid(tmp_path / "g.json", [])
