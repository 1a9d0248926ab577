"""`glmstack bench` lists the benchmarks and refuses unknown names."""

from glmstack.bench_cli import available, main


def test_lists_and_rejects(capsys):
    assert "decode" in available() and "model_throughput" in available()
    assert main([]) == 0
    assert "decode" in capsys.readouterr().out
    assert main(["no_such_bench"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
