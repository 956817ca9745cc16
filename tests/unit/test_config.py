import pytest

from agentrl.config import compose
from agentrl.types import ConfigError


@pytest.mark.parametrize(
    "override,needle",
    [
        ("+rollout.max_turn=3", "rollout.max_turn: unknown key"),
        ("algo.advantage.name=ppo2", "algo.advantage.name"),
        ("algo.loss.name=nope", "algo.loss.name"),
        ("weight_sync.method=carrier_pigeon", "weight_sync.method"),
        ("rollout.group_size=0", "rollout.group_size"),
        ("rollout.parser=hermess", "rollout.parser: unknown tool-call parser"),
        ("run_name=../elsewhere", "run_name"),
        ("learner.placement=scatter", "learner.placement"),
        ("engine.placement=k8s", "engine.placement"),
        ("+engine.ray_resources={rollout: many}", "engine.ray_resources.rollout"),
    ],
)
def test_bad_config_fails_at_the_door_with_its_path(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        compose([override])


def test_default_config_composes():
    cfg = compose()
    assert (
        cfg.env.target == "agentrl.envs.code_exec.CodeExecEnv" and cfg.algo.advantage.name == "grpo"
    )
    assert cfg.engine.host == "127.0.0.1"


def test_env_target_must_be_an_env():
    with pytest.raises(ConfigError, match="not a subclass of agentrl.Env"):
        compose(["env._target_=agentrl.types.Task"]).env.load_class()


def test_greedy_sampling_is_refused_for_training_with_the_fix():
    from agentrl.config import training_checks

    cfg = compose(["rollout.temperature=0"])  # fine for a preview ...
    with pytest.raises(ConfigError, match=r"rollout\.temperature=0 .*rollout\.temperature=1\.0"):
        training_checks(cfg)  # ... not for training
    assert training_checks(compose()) == []
    (warning,) = training_checks(compose(["rollout.top_p=0.9"]))
    assert "rollout.top_p=0.9" in warning and "truncated" in warning


def test_algo_presets_compose_and_say_how_many_optimizer_steps():
    ppo = compose(["algo=ppo"]).algo
    assert ppo.advantage.name == "gae" and ppo.uses_critic() and ppo.mini_batches == 2
    grpo = compose().algo
    assert not grpo.uses_critic() and (grpo.ppo_epochs, grpo.mini_batches) == (1, 1)
    with pytest.raises(ConfigError, match="algo.advantage.name=gae needs a critic"):
        compose(["algo=ppo", "algo.critic.enabled=false"])


def test_old_logprobs_come_from_the_update_only_when_it_is_the_batchs_one_step():
    """algo.old_logprobs=auto skips the scoring pass only where the update's own forward sees
    the same weights: one optimizer step per batch, and no KL-in-reward (it needs pi_old
    before the advantages)."""
    assert compose().algo.old_logprobs_from_update()  # grpo: 1 x 1
    assert not compose(["algo=ppo"]).algo.old_logprobs_from_update()  # 2 mini-batches
    assert not compose(["algo=gspo"]).algo.old_logprobs_from_update()
    assert not compose(["algo.ppo_epochs=2"]).algo.old_logprobs_from_update()
    reward_kl = ["algo.loss.kl_coef=0.01", "algo.loss.kl_mode=reward"]
    assert not compose(reward_kl).algo.old_logprobs_from_update()
    assert compose(["algo.loss.kl_coef=0.01"]).algo.old_logprobs_from_update()  # kl in the loss
    assert not compose(["algo.old_logprobs=recompute"]).algo.old_logprobs_from_update()


def test_a_config_error_prints_for_people_at_the_door():
    """The message, no traceback, exit 2, before anything starts; AGENTRL_DEBUG=1 shows it all."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "agentrl.cli.preview", "algo.advantage.name=nope",
           "hydra.run.dir=/tmp/agentrl-test-door"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_DEBUG"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: invalid config" in done.stderr and "unknown advantage estimator" in done.stderr
    assert "Traceback" not in done.stderr


def test_env_task_options_are_checked_against_load_tasks(tmp_path):
    """A misspelt option once fell back to the generated tasks without a word."""
    cfg = compose(["env=code_exec", "+env.tasks.pth=x.jsonl"])
    with pytest.raises(ConfigError, match=r"env.tasks.pth: unknown option of CodeExecEnv"):
        cfg.env.load_tasks(cfg.env.load_class())
    cfg = compose(["env=code_exec", "env.tasks.n=many"])
    with pytest.raises(ConfigError, match=r"env.tasks.n: Input should be a valid integer"):
        cfg.env.load_tasks(cfg.env.load_class())
    cfg = compose(["env=code_exec", f"env.tasks.path={tmp_path}/none.jsonl"])  # no `+` needed
    with pytest.raises(ConfigError, match="No such file"):
        cfg.env.load_tasks(cfg.env.load_class())
    (tmp_path / "t.jsonl").write_text('{"id": "a", "prompt": "1+1", "answer": "2"}\n')
    cfg = compose(["env=code_exec", f"env.tasks.path={tmp_path}/t.jsonl"])
    assert [t.id for t in cfg.env.load_tasks(cfg.env.load_class())] == ["a"]
    with pytest.raises(ConfigError, match="env._target_ is not set"):
        compose(["env=custom"]).env.load_class()


def test_ray_placed_engines_refuse_cuda_ipc_and_colocation():
    cfg = compose(["engine.placement=ray", "+engine.ray_resources={rollout: 1}"])
    assert cfg.engine.ray_resources == {"rollout": 1.0} and cfg.learner.placement == "pack"
    with pytest.raises(ConfigError, match=r"weight_sync\.method=tensor .*method=distributed"):
        compose(["engine.placement=ray", "weight_sync.method=tensor"])
    with pytest.raises(ConfigError, match=r"engine\.colocate=true .*engine\.placement=local"):
        compose(["engine.placement=ray", "engine.colocate=true"])
    with pytest.raises(ConfigError, match=r"engine\.urls .*engine\.placement=local"):
        compose(["engine.placement=ray", "engine.urls=[http://127.0.0.1:30000]"])
    with pytest.raises(ConfigError, match=r"engine\.ray_num_gpus"):
        compose(["engine.placement=ray", "engine.kind=sglang"])
    compose(["engine.placement=ray", "engine.kind=sglang", "engine.ray_num_gpus=1"])
    compose(["weight_sync.method=tensor"])  # local servers: CUDA IPC stays allowed


def test_disk_sync_across_nodes_asks_for_a_shared_dir():
    from agentrl.config import training_checks

    cfg = compose(["engine.placement=ray", "weight_sync.method=disk"])
    assert any("weight_sync.disk_dir" in w for w in training_checks(cfg))
    cfg = compose(
        ["engine.placement=ray", "weight_sync.method=disk", "weight_sync.disk_dir=/nfs/w"]
    )
    assert not any("disk_dir" in w for w in training_checks(cfg))


def test_the_ray_cluster_doc_command_composes():
    import re
    import shlex
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ray_cluster.md").read_text()
    (command,) = [c for c in re.findall(r"```bash\n(.*?)```", doc, flags=re.S)
                  if "agentrl.train" in c]  # fmt: skip
    args = shlex.split(command.replace("\\\n", " "))
    cfg = compose(args[args.index("agentrl.train") + 1 :])
    assert cfg.ray.address == "HEAD:6379" and cfg.learner.placement == "spread"
    assert cfg.engine.placement == "ray" and cfg.engine.ray_resources == {"rollout": 1.0}
    assert cfg.engine.tp == 2 and cfg.weight_sync.ranks_per_server == 2


def test_tp_engines_get_their_gpus_and_join_the_update_group_per_rank(monkeypatch):
    from pathlib import Path

    from agentrl.engine.fleet import server_command, server_env

    cfg = compose(["engine.kind=sglang", "engine.tp=2", "engine.num_servers=2",
                   "weight_sync.method=distributed"])  # fmt: skip
    assert cfg.weight_sync.ranks_per_server == 2  # every TP rank receives the broadcast
    cmd = server_command(cfg.engine, Path("/m"), 30000)
    assert cmd[cmd.index("--tp-size") + 1] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert [server_env(cfg.engine, i)["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["4,5", "6,7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with pytest.raises(Exception, match="need 4 GPUs"):
        server_env(cfg.engine, 0)
    one = compose(["engine.kind=sglang", "engine.num_servers=2"]).engine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [server_env(one, i)["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["2", "3"]
    # SGLang's /health must not generate: a released (colocated) server crashes on a generation,
    # and smg and Fleet.down() probe /health while it is released
    monkeypatch.setenv("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1")
    assert server_env(one, 0)["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"
    # the host's own settings pass through (NVLink multicast stays off where the host says so)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")
    env = server_env(one, 1)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_SOCKET_IFNAME"] == "eth7"
    assert "--tp-size" not in server_command(one, Path("/m"), 30000)
    with pytest.raises(ConfigError, match="no tensor parallelism"):
        compose(["engine.tp=2"])  # the dev server
    with pytest.raises(ConfigError, match="engine.tp, not --tp-size"):
        compose(["engine.kind=sglang", 'engine.extra_args=[--tp-size,"2"]'])
    with pytest.raises(ConfigError, match="ranks_per_server=4 but engine.tp=2"):
        compose(["engine.kind=sglang", "engine.tp=2", "weight_sync.ranks_per_server=4"])
    with pytest.raises(ConfigError, match="engine.ray_num_gpus=2"):
        compose(["engine.kind=sglang", "engine.tp=2", "engine.placement=ray",
                 "engine.ray_num_gpus=1", "weight_sync.method=distributed"])  # fmt: skip


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["learner.head_kernel=triton", "learner.device=cpu"], "head_kernel=triton runs on CUDA"),
        (["learner.compile=on", "learner.fused_kernels=liger"], "exclude each other"),
        (
            ["learner.attention_backend=flash", "learner.attention_layout=packed"],
            "no attention mask",
        ),
    ],
)
def test_learner_kernel_choices_that_cannot_run_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        compose(overrides)


def test_attention_backend_auto_leaves_out_cudnn_and_a_named_one_is_alone():
    """cuDNN's SDPA builds a plan per new shape (50-120 ms each way on an H100, profiled in the
    trainer's update), so auto leaves it out; a named backend is the only one torch may use."""
    from agentrl.learner import LearnerConfig

    assert LearnerConfig().sdpa_backends() == {
        "flash": True, "mem_efficient": True, "cudnn": False, "math": True,
    }  # fmt: skip
    for name, switch in [("flash", "flash"), ("efficient", "mem_efficient"), ("cudnn", "cudnn")]:
        on = LearnerConfig(attention_backend=name).sdpa_backends()
        assert [k for k, v in on.items() if v] == [switch]


def test_lora_runs_push_adapters_to_engines_that_serve_them():
    """learner.lora.sync: auto takes the adapter route on servers agentrl starts (SGLang gets
    the LoRA flags), asks servers it does not start, and merged is the old path."""
    from agentrl.weight_sync import lora_sglang_args, planned_lora_sync

    def plan(*extra: str):
        cfg = compose(list(extra))
        return planned_lora_sync(cfg.learner.lora, cfg.engine)

    assert plan() is None  # no LoRA
    assert plan("learner.lora.rank=8") == "adapter"
    assert plan("learner.lora.rank=8", "engine.urls=[http://127.0.0.1:30000]") == "ask"
    assert plan("learner.lora.rank=8", "learner.lora.sync=merged") == "merged"
    cfg = compose(["learner.lora.rank=8"])
    assert lora_sglang_args(cfg.learner.lora, []) == [
        "--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all"]  # fmt: skip
    some = cfg.learner.lora.model_copy(update={"target_modules": ["q_proj", "v_proj"]})
    assert lora_sglang_args(some, [])[-2:] == ["q_proj", "v_proj"]
    assert lora_sglang_args(some, ["--enable-lora", "--max-lora-rank", "16"]) == []
    # colocated: the memory saver drops the base weights while the learner trains, and adapter
    # pushes never rewrite them; a host copy brings them back on resume
    assert lora_sglang_args(some, [], colocate=True)[-1] == "--enable-weights-cpu-backup"
    assert lora_sglang_args(some, ["--enable-lora", "--enable-weights-cpu-backup"], True) == []
    with pytest.raises(ConfigError, match="learner.lora.sync"):
        compose(["learner.lora.sync=both"])


def test_disaggregated_learner_and_servers_get_gpus_of_their_own(monkeypatch):
    """engine.colocate=false on a host with GPUs for both: the learner's ranks take the first,
    the servers the next; too few GPUs are shared, except over NCCL (two ranks on one GPU)."""
    from agentrl.engine.fleet import server_env
    from agentrl.engine.gpus import split_local_gpus

    base = ["engine=sglang", "engine.colocate=false", "learner=gpu"]
    one = compose([*base, "weight_sync.method=distributed"]).engine
    learner, engine = split_local_gpus(one, 1, ["0", "1"], nccl=True)
    assert learner == ["0"] and engine.gpus == ["1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert server_env(engine, 0)["CUDA_VISIBLE_DEVICES"] == "1"
    two = compose([*base, "engine.num_servers=2", "engine.tp=2"]).engine  # 2 x tp=2
    learner, engine = split_local_gpus(two, 2, [str(g) for g in range(8)], nccl=True)
    assert learner == ["0", "1"] and engine.gpus == ["2", "3", "4", "5"]
    assert [server_env(engine, i)["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["2,3", "4,5"]
    pinned = compose([*base, "engine.gpus=[0]"]).engine  # the user's choice; the learner the rest
    learner, engine = split_local_gpus(pinned, 1, ["0", "1"], nccl=True)
    assert learner == ["1"] and engine.gpus == ["0"]
    # one GPU: disk sync shares it (the one-GPU async test), NCCL cannot
    assert split_local_gpus(one, 1, ["0"], nccl=False) is None
    with pytest.raises(ConfigError, match="need 2 GPUs of their own"):
        split_local_gpus(one, 1, ["0"], nccl=True)
    colocated = compose(["engine=sglang", "learner=gpu"]).engine
    assert colocated.colocate and split_local_gpus(colocated, 1, ["0", "1"], nccl=False) is None


def test_colocated_adapter_route_needs_the_servers_host_copy_of_the_base():
    """Servers the user started (engine.urls), asked through their server_info as SGLang answers
    it: colocated with the memory saver and no weights backup, auto falls back to merged weights
    and adapter is an error; a server with the backup (or not colocated) takes adapters."""
    import asyncio

    from agentrl.weight_sync import WeightSyncError, resolve_lora_sync

    class Servers:  # what /server_info answers; nothing else is asked
        urls = ["http://127.0.0.1:30000"]

        def __init__(self, **info):
            self.info = {"enable_lora": True, "enable_memory_saver": True, **info}

        async def server_info(self):
            return [self.info]

        @property
        def control(self):  # the control plane answers server_info
            return self

    bare, backed = Servers(), Servers(enable_weights_cpu_backup=True)
    assert asyncio.run(resolve_lora_sync("ask", bare, colocate=True)) == "merged"
    assert asyncio.run(resolve_lora_sync("ask", bare, colocate=False)) == "adapter"
    assert asyncio.run(resolve_lora_sync("ask", backed, colocate=True)) == "adapter"
    assert asyncio.run(resolve_lora_sync("adapter", backed, colocate=True)) == "adapter"
    with pytest.raises(WeightSyncError, match="--enable-weights-cpu-backup"):
        asyncio.run(resolve_lora_sync("adapter", bare, colocate=True))


def test_colocated_servers_each_see_only_their_own_gpus(monkeypatch):
    """Two colocated SGLang servers: each sees only its own GPU(s), and the run knows which they
    are (`own_gpus`, `Fleet.gpus`), so a push packs each server's payload on the learner rank
    beside it and no CUDA-IPC handle crosses GPUs (agentrl/learner/sync/tensor.py)."""
    from pathlib import Path

    from agentrl.engine.fleet import Fleet, server_command, server_env
    from agentrl.engine.gpus import own_gpus

    two = compose(["engine=sglang", "learner=gpu", "engine.num_servers=2"]).engine
    assert two.colocate
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [server_env(two, i)["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["0", "1"]
    assert [own_gpus(two, i) for i in (0, 1)] == [["0"], ["1"]]
    assert all("--base-gpu-id" not in server_command(two, Path("/m"), 30000 + i) for i in (0, 1))
    tp2 = compose(["engine=sglang", "learner=gpu", "engine.num_servers=2", "engine.tp=2"]).engine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert server_env(tp2, 1)["CUDA_VISIBLE_DEVICES"] == "6,7"
    fleet = Fleet(tp2, Path("/m"), Path("/logs"))
    assert fleet.gpus is None  # nothing started
    fleet.procs = [object(), object()]  # as if started
    assert fleet.gpus == [["4", "5"], ["6", "7"]]
    one = compose(["engine=sglang", "learner=gpu"]).engine
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert own_gpus(one, 0) == ["0"] and "CUDA_VISIBLE_DEVICES" not in server_env(one, 0)
    apart = compose(["engine=sglang", "engine.colocate=false", "engine.num_servers=2"]).engine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [server_env(apart, i)["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["0", "1"]


def test_the_eval_set_is_fixed_by_the_seed_and_checked_like_the_training_tasks():
    from agentrl.evaluate import pick_eval_tasks
    from agentrl.types import Task

    tasks = [Task(id=str(i), data={}) for i in range(50)]
    first = [t.id for t in pick_eval_tasks(tasks, 8, seed=0)]
    assert first == [t.id for t in pick_eval_tasks(tasks, 8, seed=0)]  # every evaluation
    assert first != [t.id for t in pick_eval_tasks(tasks, 8, seed=1)] and len(set(first)) == 8
    assert len(pick_eval_tasks(tasks, 80, seed=0)) == 50
    with pytest.raises(ConfigError, match="evaluation set is empty"):
        pick_eval_tasks([], 8, seed=0)
    cfg = compose(["env=units", "+env.eval_tasks.seed=3"])
    env_cls = cfg.env.load_class()
    assert cfg.env.load_tasks(env_cls, evaluation=True) != cfg.env.load_tasks(env_cls)
    assert compose(["env=units"]).env.load_tasks(env_cls, evaluation=True) == cfg.env.load_tasks(
        env_cls
    )  # unset: the training list
    with pytest.raises(ConfigError, match=r"env.eval_tasks.n: Input should be a valid integer"):
        compose(["env=units", "+env.eval_tasks.n=many"]).env.load_tasks(env_cls, evaluation=True)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline"])
def test_one_episode_a_group_under_a_group_baseline_is_refused(name):
    """A red-team audit: `algo=rloo rollout.group_size=1` exited 0 with every gradient 0 and no
    word why."""
    from agentrl.config import training_checks

    with pytest.raises(ConfigError, match=r"rollout\.group_size=1 .*every advantage is 0"):
        training_checks(compose([f"algo.advantage.name={name}", "rollout.group_size=1"]))
    assert training_checks(compose(["algo=ppo", "rollout.group_size=1"])) == []


def test_settings_that_learn_nothing_are_refused_or_named():
    from agentrl.config import training_checks

    with pytest.raises(ConfigError, match=r"rollout\.top_k=1 is greedy"):
        training_checks(compose(["rollout.top_k=1"]))
    cases = {
        "rollout.temperature=1e-5": "nearly greedy",
        "learner.lr=0": "weights never change",
        "learner.warmup_steps=100000": "still warming up",
        "learner.total_steps=1": None,  # constant schedule: no decay horizon to outrun
        "algo.advantage.eps=1000000": "shrinks them towards 0",
    }
    for override, said in cases.items():
        warnings = training_checks(compose([override, "trainer.steps=4"]))
        assert (said is None and warnings == []) or any(said in w for w in warnings), override
    (w,) = training_checks(compose(["learner.lr_schedule=cosine", "learner.total_steps=1",
                                    "trainer.steps=4"]))  # fmt: skip
    assert "total_steps=1 optimizer steps < trainer.steps=4" in w and "trainer step 2 on" in w


def test_the_lr_schedule_is_checked_in_optimizer_steps():
    """An audit: learner.total_steps=trainer.steps with algo.mini_batches=4 ran its cosine to
    lr 0 a quarter of the way in (the schedule counts optimizer steps), and the rest of the run
    trained nothing without a word; a warm-up as long as trainer.steps was warned of though it
    ended a quarter of the way in."""
    from agentrl.config import training_checks

    four = ["algo.mini_batches=4", "trainer.steps=100", "trainer.tasks_per_step=2",
            "rollout.group_size=4"]  # fmt: skip
    (w,) = training_checks(compose([*four, "learner.lr_schedule=cosine",
                                    "learner.total_steps=100"]))  # fmt: skip
    assert "total_steps=100 optimizer steps < the run's 400 optimizer steps" in w, w
    assert "from trainer step 26 on" in w and "nothing is learned" in w
    assert "learner.total_steps=400" in w
    assert training_checks(compose([*four, "learner.lr_schedule=cosine",
                                    "learner.total_steps=400"])) == []  # fmt: skip
    assert training_checks(compose([*four, "learner.warmup_steps=100"])) == []
    (w,) = training_checks(compose([*four, "algo.ppo_epochs=2", "learner.warmup_steps=800"]))
    assert "warmup_steps=800 >= the run's 800 optimizer steps" in w, w


def test_a_kl_coefficient_that_drowns_the_reward_is_named():
    """An audit: algo.loss.kl_coef=1e4 exited 0 with the policy held at the reference."""
    from agentrl.config import training_checks

    for mode in ("loss", "reward"):
        (w,) = training_checks(compose(["algo.loss.kl_coef=1e4", f"algo.loss.kl_mode={mode}"]))
        assert f"algo.loss.kl_coef=10000 with kl_mode={mode}" in w and "0.01% above" in w
    assert training_checks(compose(["algo.loss.kl_coef=0.05"])) == []
    assert training_checks(compose(["algo.loss.kl_coef=1.0"])) == []  # x2.7: it still moves


def test_sglang_servers_run_no_more_sequences_than_their_decode_graph_holds():
    """A decode batch past SGLang's CUDA graph batch runs without the graph (one H200, 512
    episodes: 19.0k tok/s uncapped, 41.2k capped at 256): agentrl caps running requests there
    unless the user set the cap or the graphs themselves."""
    from pathlib import Path

    from agentrl.engine.fleet import server_command

    def cap(*overrides: str) -> str | None:
        cmd = server_command(compose(["engine.kind=sglang", *overrides]).engine, Path("/m"), 1)
        flags = [i for i, a in enumerate(cmd) if a.partition("=")[0] == "--max-running-requests"]
        assert len(flags) <= 1, cmd  # never two caps on one command line
        return (cmd[flags[0]].partition("=")[2] or cmd[flags[0] + 1]) if flags else None

    assert cap() == "256"  # the shipped engine config (configs/engine/sglang.yaml)
    assert cap("engine.tp=4", "engine.num_servers=1") == "512"
    assert cap("engine.extra_args=[--cuda-graph-max-bs-decode,'160']") == "160"
    assert cap("engine.extra_args=['--cuda-graph-max-bs=96']") == "96"
    assert cap("engine.extra_args=[--max-running-requests,'1024']") == "1024"  # the user's own
    assert cap("engine.extra_args=[--disable-cuda-graph]") is None
    assert cap("engine.extra_args=[--cuda-graph-bs-decode,'8','16']") is None
    assert compose([]).engine.running_cap() == []  # the dev server has no graphs


def test_more_mini_batches_than_a_steps_episodes_is_refused_before_the_run(tmp_path):
    """A review: algo.mini_batches=16 with 2 tasks x 4 samples a step started Ray, the servers
    and the first rollout, then failed in the update. A step's episodes are the fewest sequences
    it can have (each one at least; a forked or rewritten episode makes more), so that bound is
    checked before anything starts, and every setting up to it is kept."""
    import asyncio

    from agentrl.config import training_checks
    from agentrl.train import train

    small = ["trainer.tasks_per_step=2", "rollout.group_size=4", f"checkpoint.dir={tmp_path}/c"]
    cfg = compose([*small, "algo.mini_batches=9"])
    with pytest.raises(ConfigError) as e:
        training_checks(cfg)
    (line,) = str(e.value).splitlines()
    assert "algo.mini_batches=9 is more than the 8 episodes" in line
    assert "trainer.tasks_per_step=2 x rollout.group_size=4" in line
    assert "set algo.mini_batches=8 or fewer" in line
    with pytest.raises(ConfigError, match=r"algo\.mini_batches=9"):
        asyncio.run(train(cfg, tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # nothing was built: no Ray, no servers
    assert training_checks(compose([*small, "algo.mini_batches=8"])) == []
    multi = ["rollout.thinking=template", "rollout.max_turns=4"]  # sequences >= episodes
    assert training_checks(compose([*small, *multi, "algo=ppo", "algo.mini_batches=8"])) == []


def test_a_critic_warm_up_that_outlasts_most_of_the_run_is_named():
    """PPO's advantages are rewards minus the critic's values: algo.critic.warmup_steps=1000 on
    a 200-optimizer-step run kept the critic near its untrained start to the end, and the policy
    trained on its noise without a word (only learner.warmup_steps was checked)."""
    from agentrl.config import training_checks

    run = ["algo=ppo", "trainer.steps=100", "trainer.tasks_per_step=2"]  # ppo: 2 mini-batches
    (w,) = training_checks(compose([*run, "algo.critic.warmup_steps=1000"]))
    assert "algo.critic.warmup_steps=1000 of the run's 200 optimizer steps" in w, w
    assert "still warming up from 0 when the run ends" in w and "warmup_steps=10 or" in w
    (w,) = training_checks(compose([*run, "algo.critic.warmup_steps=150"]))
    assert "only after 75% of the run (trainer step 76 of 100)" in w, w
    (w,) = training_checks(compose([*run, "learner.warmup_steps=120"]))  # inherited
    assert w.startswith("learner.warmup_steps=120 (the critic's: algo.critic")
    assert training_checks(compose([*run, "algo.critic.warmup_steps=20"])) == []
    assert training_checks(compose([*run, "learner.warmup_steps=120",
                                    "algo.critic.warmup_steps=10"])) == []  # fmt: skip
    (w,) = training_checks(compose([*run, "algo.critic.lr=0"]))
    assert "the critic never trains" in w
    assert training_checks(compose(["trainer.steps=4", "algo.critic.warmup_steps=1000"])) == []
