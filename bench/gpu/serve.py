"""Start one SGLang server with agentrl's own launch command on a GPU machine, for the device
scripts that compare server settings side by side (bench/gpu/http.sh): configs/engine/sglang.yaml
through `fleet.server_command` as `bench/rollout_throughput.py --engine sglang` builds it (no
memory saver, the running cap in, the run's key file), plus EXTRA arguments, then exec'd.

    AGENTRL_ENGINE_API_KEY=k python3 bench/gpu/serve.py MODEL PORT [EXTRA ...]
"""

import argparse
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollout_throughput import engine_config  # noqa: E402

from agentrl.engine.config import default_api_key  # noqa: E402
from agentrl.engine.fleet import server_command, write_key_file  # noqa: E402


def main() -> None:
    model, port, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    a = argparse.Namespace(engine="sglang", memory_saver=False, threads=1,
                           server_args=shlex.join(extra))  # fmt: skip
    keys = write_key_file(Path(f"/tmp/keys-{port}.yaml"), default_api_key())
    cmd = server_command(engine_config(a), Path(model), port, keys)
    print("launch:", shlex.join(cmd), flush=True)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
