"""Generation with the embedded SmolLM2-135M-Instruct: greedy parity with transformers, stop strings
that span token boundaries, the prompt builder."""
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.sampling import SamplingConfig, build_prompt, generate, make_generate_fn
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.sampling.stops import StopFinder

torch = pytest.importorskip("torch")

# The tests that build transformers' copy of our SmolLM2 weights (conftest.smollm2_torch_copy) run on one
# xdist worker: the copy and torch are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("smollm2_torch_copy")

QUESTIONS = ["Write a Python function that adds two numbers.", "What is the capital of France?"]
STEPS = 40


@pytest.fixture(scope="module")
def greedy_run(smollm2):
  model, tok = smollm2
  graphdef, params = nnx.split(model)
  prompts = [build_prompt(tok, q) for q in QUESTIONS]
  config = SamplingConfig(temperature=0.0, max_new_tokens=STEPS, eos_ids=(), bucket_lengths=(64,))
  return graphdef, params, tok, prompts, config, generate(graphdef, params, tok, prompts, config, 0)


@pytest.mark.slow
def test_greedy_matches_transformers_generate(greedy_run, smollm2_torch_copy):
  _, _, tok, prompts, _, res = greedy_run
  hf_model = smollm2_torch_copy
  hf_model.generation_config.eos_token_id = None
  for i, prompt in enumerate(prompts):
    ids = torch.tensor([encode_prompts(tok, [prompt])[0]])
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=STEPS,
                            min_new_tokens=STEPS, top_k=None, top_p=None, pad_token_id=tok.pad_token_id)
    np.testing.assert_array_equal(res.tokens[i], out[0, ids.shape[1]:].numpy())


def _spanning_stop(tok, tokens):
  """A 6-character piece of the completion text that starts inside one token and ends in another."""
  pieces = [tok.decode([int(t)]) for t in tokens]
  ends = np.cumsum([len(p) for p in pieces])
  text = "".join(pieces)
  for i in range(len(pieces) - 1):
    start = ends[i] - 2  # two characters of token i, four of the next tokens
    stop = text[start:start + 6]
    if len(pieces[i]) >= 3 and len(stop) == 6 and stop.isprintable() and text.find(stop) == start:
      return stop
  pytest.skip("no suitable stop string in the completion")


def test_stop_string_spanning_tokens_ends_at_the_right_token(greedy_run):
  graphdef, params, tok, prompts, config, res = greedy_run
  stop = _spanning_stop(tok, res.tokens[0])
  full_text = res.texts[0]
  # The oracle: the first token whose prefix decodes to text containing the stop.
  want = next(t for t in range(1, STEPS + 1) if stop in tok.decode(res.tokens[0][:t].tolist()))
  # Check every 4 tokens so the stop can straddle a chunk boundary.
  cut = generate(graphdef, params, tok, prompts, config.replace(stop_strings=("</never>", stop),
                                                                stop_check_every=4), 0)
  np.testing.assert_array_equal(cut.tokens[0], res.tokens[0][:want])
  assert cut.finish_reasons[0] == "stop" and cut.lengths[0] == want
  assert cut.texts[0] == full_text[:full_text.index(stop) + len(stop)]
  assert len(cut.logprobs[0]) == want
  # The other row does not contain the stop string and runs to the length limit, unchanged.
  if stop not in res.texts[1]:
    assert cut.finish_reasons[1] == "length"
    np.testing.assert_array_equal(cut.tokens[1], res.tokens[1])


def test_stop_finder_unit(smollm2):
  _, tok = smollm2
  ids = tok.encode("<think> x </think> <answer> 42 </answer> and more")
  finder = StopFinder(tok, ("</answer>",))
  t = finder.first_stop(np.asarray(ids), 0, len(ids))
  assert "</answer>" in tok.decode(ids[:t + 1]) and "</answer>" not in tok.decode(ids[:t])
  assert finder.cut("a </answer> b </answer>") == "a </answer>"
  assert finder.first_stop(np.asarray(ids), t + 1, t + 1) is None


def test_eos_ends_rows_and_make_generate_fn(smollm2):
  model, tok = smollm2
  fn = make_generate_fn(model, tok, SamplingConfig(temperature=0.0, max_new_tokens=24, bucket_lengths=(64,)))
  texts = fn([build_prompt(tok, "Say hi.")])
  assert len(texts) == 1 and isinstance(texts[0], str) and texts[0]
  assert "<|im_end|>" not in texts[0]


def test_build_prompt_styles(smollm2):
  _, tok = smollm2
  chat = build_prompt(tok, "Hello", system="Be brief.")
  assert chat.endswith("<|im_start|>assistant\n") and "Be brief." in chat and "Hello" in chat
  azr = "A conversation between User and Assistant. User: Hi\nAssistant: <think>"
  assert build_prompt(tok, azr, style="plain") == azr
  assert build_prompt(tok, "Q", style="plain", system="S") == "S\nQ"
  ids = encode_prompts(tok, [azr])[0]
  assert tok.decode(ids) == azr
  with pytest.raises(ValueError, match="prompt style 'xml'"):
    build_prompt(tok, "Q", style="xml")
