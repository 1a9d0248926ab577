"""The environments (each registers itself in env.ENVS by name):

calculator  arithmetic questions to answer with the calculator tool (the SFT tool set's calculator items)
python      small programs to solve by running code in glmstack.sandbox (the SFT tool set's python items)
functions   executable BFCL-style functions over several user turns, checked on the final state
files       create or fix files in a sandbox directory; checked by running tests in the sandbox
roles       a multi-agent role task: the model writes a sentence, then reviews its own draft as the reviewer
"""

from glmstack.posttrain.agentic.envs import files, functions, roles, tools  # noqa: F401 (registration)
