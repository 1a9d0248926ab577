"""Data recipes are the recipes' `data()` stages, chosen by name like every other stage, or a JSON config."""

import pytest

from glmstack.config import ConfigError, write_json
from glmstack.data.cli import load_recipe
from glmstack.data.pipeline import PipelineConfig
from glmstack.recipes import speedrun, tiny


def test_data_recipes_are_recipe_stages(tmp_path):
    assert load_recipe("tiny") == tiny.data() and load_recipe("speedrun") == speedrun.data()
    assert load_recipe("default") == PipelineConfig()
    write_json(tiny.data(), tmp_path / "tiny.json")
    assert load_recipe(str(tmp_path / "tiny.json")) == tiny.data()


@pytest.mark.parametrize("name, says", [("glm5_dsa", "has no data"), ("nope", "unknown recipe 'nope'")])
def test_a_recipe_without_data_is_a_config_error(name, says):
    with pytest.raises(ConfigError, match=says):
        load_recipe(name)
