"""The demo's compact prompts: no seed program is one of the solver prompt's worked examples."""
import ast
import importlib.util
import pathlib

from compassplay_jax.domains.coding import buffers, tasks
from compassplay_jax.settings.coding import compact_prompts
from compassplay_jax.settings.coding import setting as coding

REPO = pathlib.Path(__file__).resolve().parents[1]


def _demo_config():
  spec = importlib.util.spec_from_file_location("coding_config", REPO / "configs" / "coding.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("demo")


def _demo_seeds():
  config = _demo_config()
  assert config.coding.prompt_style == "compact"
  bufs = buffers.load_azr_seed_dir(coding.seed_dir_path(config.coding.seed_dir))
  return config, [t for b in bufs.values() for t in b]


def test_no_demo_seed_is_a_worked_example():
  _, seeds = _demo_seeds()
  worked = {ast.dump(ast.parse(compact_prompts.worked_example_program(body)))
            for body, _, _ in compact_prompts.WORKED_EXAMPLES}
  assert len(seeds) >= 8
  for seed in seeds:  # same syntax tree = same program, whatever the spacing
    assert ast.dump(ast.parse(seed.program)) not in worked, seed.program


def test_a_seed_tasks_solver_prompt_shows_its_program_once():
  """The prompt shows the worked examples, then the task: a seed's program block appears once."""
  config, seeds = _demo_seeds()
  for seed in seeds:
    if seed.type not in compact_prompts.TASK_TYPES:
      continue
    prompt = compact_prompts.solver_prompt(seed, config.coding.solver_prefix)
    assert prompt.count("```python\n") == 1 + len(compact_prompts.WORKED_EXAMPLES)
    assert prompt.count(f"```python\n{seed.program}\n```") == 1, seed.program
    assert prompt.endswith(f"```python\n{seed.program}\n```\n"
                           f"```{'input' if seed.type == tasks.DEDUCTION else 'output'}\n"
                           f"{seed.input if seed.type == tasks.DEDUCTION else seed.output}\n```\n")
