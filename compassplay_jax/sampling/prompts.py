"""Prompt text and prompt token ids: the chat/plain prompt builder and the encoder `generate` uses."""
from __future__ import annotations

PROMPT_STYLES = ("chat", "plain")


def build_prompt(tokenizer, user_text: str, style: str = "chat", system: str | None = None) -> str:
  """The prompt text for one user turn.

  "chat": the tokenizer's chat template with the generation prompt appended (system turn if given).
  "plain": plain concatenation, system + "\\n" + user_text; AZR-style callers pass the whole R1 wrapper
  ending in "Assistant: <think>" as user_text, and it is used verbatim.
  """
  if style == "chat":
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": user_text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  if style == "plain":
    return user_text if system is None else f"{system}\n{user_text}"
  raise ValueError(f"prompt style {style!r} is not one of {PROMPT_STYLES}")


def encode_prompts(tokenizer, prompts) -> list[list[int]]:
  """Token ids per prompt. Strings get the tokenizer's special tokens (e.g. BOS) once: a chat
  template that already starts with BOS does not get a second one. Id lists pass through."""
  out = []
  for i, prompt in enumerate(prompts):
    if isinstance(prompt, str):
      if tokenizer is None:
        raise ValueError(f"prompt {i} is text but no tokenizer was given")
      ids = list(tokenizer.encode(prompt, add_special_tokens=True))
      bos = getattr(tokenizer, "bos_token_id", None)
      if bos is not None and ids[:2] == [bos, bos]:
        ids = ids[1:]
    else:
      ids = [int(t) for t in prompt]
    if not ids:
      raise ValueError(f"prompt {i} is empty")
    out.append(ids)
  return out
