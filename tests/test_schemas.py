"""The JSON Schemas shipped for the experiment YAML and record.yaml: equal to the models the kit
loads those files with, and checking every built-in experiment and a real record; a file
that breaks one is refused naming the file and the field."""

from __future__ import annotations

import pytest
import yaml

from kvpressure.cli import main
from kvpressure.paths import data_dir
from kvpressure.schema_files import NAMES, problems, schema_path, schema_text
from kvpressure.schemas import generated


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_schemas_are_the_models(name):
    # python -m kvpressure.schemas writes them again after a model changes
    assert schema_path(name).read_text(encoding="utf-8") == schema_text(generated(name))


def test_every_built_in_experiment_and_a_real_record_validate(ci_small_report):
    for path in sorted((data_dir() / "experiments").glob("*.yaml")):
        assert problems("experiment", yaml.safe_load(path.read_text())) == [], path
    run = ci_small_report.run_dir
    assert problems("record", yaml.safe_load((run / "record.yaml").read_text())) == []
    assert problems("experiment", yaml.safe_load((run / "experiment.yaml").read_text())) == []


def test_a_file_breaking_the_schema_is_refused_naming_the_field(tmp_path, capsys):
    good = data_dir() / "experiments" / "ci_small.yaml"
    data = yaml.safe_load(good.read_text())
    data["engine"]["max_num_seqs"] = "many"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    assert main(["schema", "experiment", str(good)]) == 0
    assert "ci_small.yaml: valid experiment" in capsys.readouterr().out
    assert main(["schema", "experiment", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not a valid experiment" in err and "engine.max_num_seqs:" in err
    assert main(["schema", "record"]) == 0
    assert '"title": "kvpressure investigation record (record.yaml)"' in capsys.readouterr().out


def test_every_record_written_is_checked_against_the_shipped_schema(tmp_path, monkeypatch):
    from kvpressure import schema_files as schemas
    from kvpressure.record.io import validate_record, write_record
    from report_helpers import valid_record

    record = validate_record(valid_record())
    write_record(record, tmp_path / "record.yaml")  # the shipped schema holds it
    drifted = dict(schemas.shipped("record"))
    drifted["required"] = [*drifted["required"], "a_field_the_model_lacks"]
    monkeypatch.setattr(schemas, "shipped", lambda name: drifted)
    schemas._validator.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="breaks data/schemas/record.schema.json"):
            write_record(record, tmp_path / "again.yaml")
        assert not (tmp_path / "again.yaml").exists()
    finally:
        schemas._validator.cache_clear()
