"""Absolute Zero Reasoner's coding prompts, verbatim, and the wrapper AZR puts around every prompt.

AZR (https://github.com/LeapLabTHU/Absolute-Zero-Reasoner), `paper` branch, commit
41ed983cdf541cfcd2f963f33c055d50074f3c90. Each string below is copied character for character
(AZR's names and line numbers beside it); the fill functions at the bottom follow AZR's
`get_code_problem_generator_prompt` / `get_code_problem_predictor_prompt` (prompts.py L335-410) with
the paper run's settings (scripts/selfplay/coder7b.sh, configs/azr_ppo_trainer.yaml): no composite
functions (composite_start_step=-1), remove_after_return=False, remove_input_from_snippet=False,
include_references=True. tests/test_azr_prompts.py checks them against prompts rendered by AZR's own
code at that commit (tests/fixtures/azr_prompts_41ed983.json). docs/coding_tasks.md has the details.

AZR's licence notice, as its MIT licence requires:

  MIT License

  Copyright (c) 2025 LeapLab

  Permission is hereby granted, free of charge, to any person obtaining a copy
  of this software and associated documentation files (the "Software"), to deal
  in the Software without restriction, including without limitation the rights
  to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
  copies of the Software, and to permit persons to whom the Software is
  furnished to do so, subject to the following conditions:

  The above copyright notice and this permission notice shall be included in all
  copies or substantial portions of the Software.

  THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
  IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
  FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
  AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
  LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
  OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
  SOFTWARE.
"""
from typing import Sequence, Tuple

SOURCE = ("LeapLabTHU/Absolute-Zero-Reasoner@41ed983cdf541cfcd2f963f33c055d50074f3c90 "
          "absolute_zero_reasoner/data_construction/prompts.py")

# absolute_zero_reasoner/data_construction/process_data.py L51 `instruction_following`: the one user
# turn of every training prompt (reward_fn.extraction_type=answer_conditional) and of AZR's code
# evaluation; AZR's chat template is plain concatenation, so this is the whole model input.
INSTRUCTION_FOLLOWING = "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. User: {}\nAssistant: <think>"

# prompts.py L3-59 `code_input_prompt`: abduction proposer.
CODE_INPUT_PROMPT = """
## Task: Create a Python Code Snippet (where custom classes are allowed, which should be defined at the top of the code snippet) with one Matching Input

Using the reference code snippets provided below as examples, design a new and unique Python code snippet that demands deep algorithmic reasoning to deduce one possible input from a given output. Your submission should include both a code snippet and test input pair, where the input will be plugged into the code snippet to produce the output, which that function output be given to a test subject to come up with any input that will produce the same function output. This is meant to be an I.Q. test.

### Code Requirements:
- Name the entry function `f` (e.g., `def f(...): ...`), you can have nested definitions inside `f`
- Ensure the function returns a value
- Include at least one input parameter
- Make the function deterministic
- Make the snippet require state tracking across multiple data transformations, ensuring the task requires long multi step reasoning
- AVOID THE FOLLOWING:
  * Random functions or variables
  * Date/time operations
  * I/O operations (reading files, network requests)
  * Printing or logging
  * Any external state
- Ensure execution completes within 10 seconds on a modern CPU
- All imports and class definitions should be at the very top of the code snippet
- The snippet should end with a return statement from the main function `f`, anything after will be removed
{remove_input_from_snippet_prompt}{remove_after_return_prompt}
### Input Requirements:
- Provide exactly one test input for your function
- Format multiple arguments with commas between them
- Remember to add quotes around string arguments

### Formatting:
- Format your code with: ```python
  def f(...):
      # your code here
      return ...
  ```
- Format your input with: ```input
  arg1, arg2, ...
  ```

### Example Format:
```python
def f(name: str, info: dict):
    # code logic here
    return result
```

```input
'John', {{'age': 20, 'city': 'New York'}}
```

### Evaluation Criteria:
- Executability, your code should be executable given your input
- Difficulty in predicting the output from your provided input and code snippet. Focus on either algorithmic reasoning or logic complexity. For example, you can define complex data structure classes and operate on them like trees, heaps, stacks, queues, graphs, etc, or use complex control flow, dynamic programming, recursions, divide and conquer, greedy, backtracking, etc
- Creativity, the code needs to be sufficiently different from the provided reference snippets
- Restricted usage of certain keywords and packages, you are not allowed to use the following words in any form, even in comments: <|BANNED_KEYWORDS|>

First, carefully devise a clear plan: e.g., identify how your snippet will be challenging, distinct from reference snippets, and creative. Then, write the final code snippet and its inputs.

### Reference Code Snippets:
"""

# prompts.py L61-119 `code_output_prompt`: deduction proposer.
CODE_OUTPUT_PROMPT = """
## Task: Create a New Python Code Snippet (where custom classes are allowed, which should be defined at the top of the code snippet) with one Matching Input

Using the reference code snippets provided below as examples, design a new and unique Python code snippet that demands deep algorithmic reasoning to deduce the output from the input. Your submission should include a code snippet and a test input pair, where the input will be plugged into the code snippet to produce the output. The input will be given to a test subject to deduce the output, which is meant to be an I.Q. test.

### Code Requirements:
- Name the entry function `f` (e.g., `def f(...): ...`), you can have nested definitions inside `f`
- Ensure the function returns a value
- Include at least one input parameter
- Make the function deterministic
- Make the snippet require state tracking across multiple data transformations, ensuring the task requires long multi step reasoning
- AVOID THE FOLLOWING:
  * Random functions or variables
  * Date/time operations
  * I/O operations (reading files, network requests)
  * Printing or logging
  * Any external state
- Ensure execution completes within 10 seconds on a modern CPU
- All imports and class definitions should be at the very top of the code snippet
- The snippet should end with a return statement from the main function `f`, anything after will be removed
{remove_input_from_snippet_prompt}{remove_after_return_prompt}
### Input Requirements:
- Provide exactly one test input for your function
- Format multiple arguments with commas between them
- Remember to add quotes around string arguments

### Formatting:
- Format your code with:
```python
def f(...):
    # your code here
    return ...
```
- Format your input with:
```input
arg1, arg2, ...
```

### Example Format:
```python
def f(name: str, info: dict):
    # code logic here
    return result
```

```input
'John', {{'age': 20, 'city': 'New York'}}
```

### Evaluation Criteria:
- Executability, your code should be executable given your input
- Difficulty in predicting your ```input``` from 1) your ```python``` code and 2) the deterministic ```output``` that will be obtained from your ```input```. Focus on either algorithmic reasoning or logic complexity. For example, you can define complex data structure classes and operate on them like trees, heaps, stacks, queues, graphs, etc, or use complex control flow, dynamic programming, recursions, divide and conquer, greedy, backtracking, etc
- Creativity, the code needs to be sufficiently different from the provided reference snippets
- Restricted usage of certain keywords and packages, you are not allowed to use the following words in any form, even in comments: <|BANNED_KEYWORDS|>

First, carefully devise a clear plan: e.g., identify how your snippet will be challenging, distinct from reference snippets, and creative. Then, write the final code snippet and its inputs.

### Reference Code Snippets:
"""

# prompts.py L181-223 `code_function_prompt`: induction proposer.
CODE_FUNCTION_PROMPT = """
## Task: Output {num_inputs} Inputs that can be plugged into the following Code Snippet to produce diverse Outputs, and give a message related to the given snippet.

Using the code snippet provided below, design {num_inputs} inputs that can be plugged into the code snippet to produce a diverse set of outputs. A subset of your given input and its deterministically produced outputs will be given to a test subject to deduce the function, which is meant to be an I.Q. test. You can also leave a message to the test subject to help them deduce the code snippet.

### Input Requirements:
- Provide {num_inputs} valid inputs for the code snippet
- For each input, format multiple arguments with commas between them
- Remember to add quotes around string arguments
- Each input should be individually wrapped in ```input``` tags

### Message Requirements:
- Leave a message to the test subject to help them deduce the code snippet
- The message should be wrapped in ```message``` tags
- The message can be in any form, can even be formed into a coding question, or a natural language instruction what the code snippet does
- You cannot provide the code snippet in the message

### Formatting:
- Format your input with:
```input
arg1, arg2, ...
```

### Example Format:
```input
'John', {{'age': 20, 'city': 'New York'}}
```
```input
'Sammy', {{'age': 37, 'city': 'Los Angeles'}}
```

### Evaluation Criteria:
- Executability, your code should be executable given your inputs
- Coverage, the inputs and outputs should cover the whole input space of the code snippet, able to deduce the code snippet from the inputs and outputs
- Creativity, the inputs need to be sufficiently different from each other
- The overall selection of inputs and message combined should be challenging for the test subject, but not impossible for them to solve
First, carefully devise a clear plan: e.g., understand the code snippet, then identify how your proposed inputs have high coverage, and why the inputs will be challenging and creative. Then, write the inputs and message. Remember to wrap your inputs in ```input``` tags, and your message in ```message``` tags.

### Code Snippet:
```python
{snippet}
```
"""

# prompts.py L225-247 `code_input_predictor_prompt`: abduction solver.
CODE_INPUT_PREDICTOR_PROMPT = """
# Task: Provide One Possible Input of a Python Code Snippet Given the Code and Output
Given the following Code Snippet and the Output, think step by step then provide one possible input that produced the output. The input needs to be wrapped in ```input``` tags. Remember if an argument is a string, wrap it in quotes. If the function requires multiple arguments, separate them with commas.

# Code Snippet:
```python
{snippet}
```

# Output:
```output
{output}
```

# Output Format:
```input
arg1, arg2, ...
```
# Example Output:
```input
'John', {{'age': 20, 'city': 'New York'}}
```
"""

# prompts.py L249-267 `code_output_predictor_prompt`: deduction solver.
CODE_OUTPUT_PREDICTOR_PROMPT = """
# Task: Deduce the Output of a Python Code Snippet Given the Code and Input
Given the following Code Snippet and the Input, think step by step then deduce the output that will be produced from plugging the Input into the Code Snippet. Put your output in ```output``` tags. Remember if the output is a string, wrap it in quotes. If the function returns multiple values, remember to use a tuple to wrap them.

# Code Snippet:
```python
{snippet}
```

# Input:
```input
{input_args}
```

# Example Output:
```output
{{'age': 20, 'city': 'New York'}}
```
"""

# prompts.py L289 `code_suffix`: appended to the induction proposer's snippet.
CODE_SUFFIX = "\nf(<|YOUR INPUT WILL BE PLUGGED HERE|>)"

# prompts.py L291-325 `code_function_predictor_prompt`: induction solver.
CODE_FUNCTION_PREDICTOR_PROMPT = """
# Task: Deduce the Function that Produced the Outputs from the Inputs
Given a set of input/output pairs and a message that describes the function, think through the problem step by step to deduce a general code snippet. This code should produce the hidden outputs from the hidden inputs, matching the original data-generating code that created the input/output pairs. Place your final answer inside python tags! It may be helpful to work through each input/output pair individually to test your function. If your function doesn’t work as expected, revise it until it does. The final code snippet will be used to evaluate your response, which is wrapped in ```python``` tags.

# Code Requirements:
- Name the entry function `f` (e.g., `def f(...): ...`), you can have nested definitions inside `f`
- Ensure the function returns a value
- Include at least one input parameter
- Make the function deterministic
- AVOID THE FOLLOWING:
  * Random functions or variables
  * Date/time operations
  * I/O operations (reading files, network requests)
  * Printing or logging
  * Any external state
- Ensure execution completes within 10 seconds on a modern CPU
- All imports and class definitions should be at the very top of the code snippet
- The snippet should end with a return statement from the main function `f()`, anything after will be removed

# Input and Output Pairs:
{input_output_pairs}

# Message:
```message
{message}
```

# Example Output:
```python
def f(a):
    return a
```

Name your entry function `f()`!!!
"""

# prompts.py L331 `remove_input_from_snippet_prompt`: used only with remove_input_from_snippet=True.
REMOVE_INPUT_FROM_SNIPPET_PROMPT = "- Do not have the test input anywhere in the code snippet, provide it in the input section."

# prompts.py L333 `remove_singleton_variables_prompt`: used only with remove_after_return=True.
REMOVE_SINGLETON_VARIABLES_PROMPT = "- All variable declarations must be inside the main function `f` or within functions `f` make calls to. Any variables declared outside of functions will be removed.\n"

# ---- filling, as AZR fills them (prompts.py L335-410) ----------------------------------------------

# AZR's names for the task types: deduction, abduction, induction.
CODE_O, CODE_I, CODE_F = "code_o", "code_i", "code_f"
_GENERATOR_TEMPLATES = {CODE_I: CODE_INPUT_PROMPT, CODE_O: CODE_OUTPUT_PROMPT}


def instruction_following(prompt: str) -> str:
  """The full model input for one prompt (process_data.py L51; constructor.py L78, L167, L176)."""
  return INSTRUCTION_FOLLOWING.format(prompt)


def reference_snippets_text(references: Sequence[Tuple[str, str, str]]) -> str:
  """The (snippet, input, output) references as AZR lists them (prompts.py L350-351)."""
  return "".join(f"<snippet_{i}>\n```python\n{snippet}\n```\n```input\n{inp}\n```\n```output\n{out}\n```\n"
                 f"</snippet_{i}>\n" for i, (snippet, inp, out) in enumerate(references))


def generator_prompt(problem_type: str, references: Sequence[Tuple[str, str, str]],
                     banned_keywords: Sequence[str], num_inputs: int = 10,
                     remove_after_return: bool = False, remove_input_from_snippet: bool = False) -> str:
  """AZR's `get_code_problem_generator_prompt` for code_i / code_o / code_f, no composite functions.

  references: (snippet, input, output) triplets; code_f shows the first snippet only (AZR's io_n = 1).
  """
  if problem_type == CODE_F:  # L376-380
    return CODE_FUNCTION_PROMPT.format(num_inputs=num_inputs, snippet=references[0][0] + CODE_SUFFIX)
  if problem_type not in _GENERATOR_TEMPLATES:
    raise ValueError(f"AZR problem type must be one of {CODE_O, CODE_I, CODE_F}, got {problem_type!r}")
  body = _GENERATOR_TEMPLATES[problem_type].format(  # L352-363 / L364-375
      remove_after_return_prompt=REMOVE_SINGLETON_VARIABLES_PROMPT if remove_after_return else "\n",
      remove_input_from_snippet_prompt=REMOVE_INPUT_FROM_SNIPPET_PROMPT if remove_input_from_snippet else "")
  return body.replace("<|BANNED_KEYWORDS|>", ", ".join(banned_keywords)) + reference_snippets_text(references) + "\n"


def predictor_prompt(problem_type: str, snippet: str = "", input_args: str = "", output: str = "",
                     message: str = "", input_output_pairs: Sequence[Tuple[str, str]] = ()) -> str:
  """AZR's `get_code_problem_predictor_prompt` (L401-410): the solver's prompt for one task."""
  if problem_type == CODE_I:
    return CODE_INPUT_PREDICTOR_PROMPT.format(snippet=snippet, output=output)
  if problem_type == CODE_O:
    return CODE_OUTPUT_PREDICTOR_PROMPT.format(snippet=snippet, input_args=input_args)
  if problem_type == CODE_F:
    pairs = "".join(f"```input_{i}\n{x}\n```\n```output_{i}\n{y}\n```\n" for i, (x, y) in enumerate(input_output_pairs))
    return CODE_FUNCTION_PREDICTOR_PROMPT.format(input_output_pairs=pairs, message=message)
  raise ValueError(f"AZR problem type must be one of {CODE_O, CODE_I, CODE_F}, got {problem_type!r}")
