import json

import pytest

from tensorfleet.strategies.tf_config import ClusterSpec, TFConfigError, parse_tf_config, tf_config_from_env


def test_local_cluster_has_free_ports_on_loopback_in_task_order() -> None:
    spec = ClusterSpec.local(workers=2, ps=1, chief=True, evaluator=True)
    assert list(spec.jobs) == ["chief", "worker", "ps", "evaluator"]
    addresses = [t.address for t in spec.tasks()]
    assert len(addresses) == len(set(addresses)) == 5
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert [str(t) for t in spec.tasks()] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]


def test_tf_config_for_each_task() -> None:
    spec = ClusterSpec.local(workers=2, ps=1, ports=[2001, 2002, 2003])
    assert json.loads(spec.tf_config_json("ps", 0)) == {
        "cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"], "ps": ["127.0.0.1:2003"]},
        "task": {"type": "ps", "index": 0},
    }
    assert parse_tf_config(spec.tf_config("worker", 1)).task.address == "127.0.0.1:2002"
    assert spec.to_tf().as_dict() == spec.as_dict()


def test_environment_tf_config() -> None:
    assert tf_config_from_env({}) is None
    assert tf_config_from_env({"TF_CONFIG": "  "}) is None
    config = tf_config_from_env({"TF_CONFIG": '{"cluster": {"worker": ["h:1", "h:2"], "ps": ["h:3"]}}'})
    assert (config.num_workers, config.has_ps, config.task) == (2, True, None)


@pytest.mark.parametrize("value, message", [
    ("{not json", "TF_CONFIG is not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2). "
                  "Received: '{not json'"),
    ("[1]", "TF_CONFIG must be a JSON object. Received: [1]"),
    ("{}", 'TF_CONFIG has no \'cluster\'. Expected e.g. {"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": '
           '"worker", "index": 0}}'),
    ({"cluster": {"worker": ["h:1"]}, "task": {"type": "ps", "index": 0}},
     "Task type 'ps' is not in the cluster, which has: worker."),
    ({"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 2}},
     "Task index 2 is out of range for 'worker', which has 2 task(s) (0..1)."),
    ({"cluster": {"worker": ["h:port"]}},
     "cluster['worker'][0] has a port that is not a number. Received: 'h:port'; expected e.g. 'h:2222'"),
    ({"cluster": {"worker": ["h:1"], "ps": ["h:1"]}},
     "Two tasks share the address 'h:1': worker:0 and ps:0. Every task needs its own host:port."),
    ({"cluster": {"boss": ["h:1"]}},
     "Unknown task type 'boss' in the cluster. Expected one of: chief, worker, ps, evaluator."),
    ({"cluster": {"worker": "h:1"}}, "cluster['worker'] must be a list of 'host:port' strings. Received: 'h:1'"),
    ({"cluster": {"worker": ["h1"]}}, "cluster['worker'][0] must be a 'host:port' string. Received: 'h1'"),
    ({"cluster": {"worker": ["h:0"]}}, "cluster['worker'][0] has a port outside 1..65535. Received: 'h:0'"),
    ({"cluster": {"chief": ["h:1", "h:2"]}}, "A cluster has at most one chief. Received 2: ['h:1', 'h:2']"),
    ({"cluster": {"worker": ["h:1"]}, "task": "worker"},
     "TF_CONFIG 'task' must be an object with 'type' and 'index'. Received: 'worker'"),
])
def test_every_tf_config_error_is_clear(value, message) -> None:
    with pytest.raises(TFConfigError) as info:
        parse_tf_config(value)
    assert str(info.value) == message


def test_local_cluster_argument_errors() -> None:
    with pytest.raises(ValueError,
                       match=r"A cluster needs at least one worker or a chief. Received: workers=0, chief=False"):
        ClusterSpec.local(workers=0)
    with pytest.raises(ValueError, match=r"ps must be an integer >= 0. Received: ps=-1"):
        ClusterSpec.local(workers=1, ps=-1)
    with pytest.raises(ValueError, match=r"ports must list one port per task \(2\). Received 1: \[5\]"):
        ClusterSpec.local(workers=2, ports=[5])
