# nanoGPT's configurator.py, as train.py execs it: --key=value overrides a global, a bare
# argument is a config file exec'd in the script's globals.
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if "=" not in arg:
        assert not arg.startswith("--")
        config_file = arg
        with open(config_file) as f:
            exec(f.read())
    else:
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        if key in globals():
            try:
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                attempt = val
            assert type(attempt) is type(globals()[key])
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")
