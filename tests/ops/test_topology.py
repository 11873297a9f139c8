"""Alert grouping along provider -> region -> site/pool -> host/device -> job, with a root cause."""

from __future__ import annotations

from broker.ops.topology import Topology, group_alerts, path_of


def _host(provider: str, region: str, pool: str, host: str, **more: str) -> dict[str, str]:
    return {"provider": provider, "region": region, "pool": pool, "host": host, **more}


FLEET = Topology(
    [_host("aws", "us-east-1", "p1", f"h{i}") for i in range(4)]
    + [_host("aws", "us-east-1", "p2", f"k{i}") for i in range(4)]
    + [{"provider": "onprem", "region": "dc1", "site": "rack1", "host": f"o{i}"} for i in range(6)]
)


def test_most_hosts_of_a_pool_alerting_name_the_pool() -> None:
    alerts = [_host("aws", "us-east-1", "p1", "h0"), _host("aws", "us-east-1", "p1", "h1"),
              _host("aws", "us-east-1", "p1", "h2", job="j7"),
              {"provider": "onprem", "region": "dc1", "site": "rack1", "host": "o3"}]
    groups = group_alerts(alerts, FLEET)
    by_root = {g.key: g for g in groups}
    assert set(by_root) == {"provider=aws/region=us-east-1/pool=p1",
                            "provider=onprem/region=dc1/site=rack1/host=o3"}
    assert by_root["provider=aws/region=us-east-1/pool=p1"].members == (0, 1, 2)
    assert "3 of 4" in by_root["provider=aws/region=us-east-1/pool=p1"].explanation


def test_both_pools_of_a_region_alerting_name_the_region() -> None:
    alerts = [_host("aws", "us-east-1", p, h) for p, h in (("p1", "h0"), ("p1", "h1"), ("p2", "k0"), ("p2", "k3"))]
    (group,) = group_alerts(alerts, FLEET)
    assert group.key == "provider=aws/region=us-east-1" and group.members == (0, 1, 2, 3)


def test_a_few_hosts_among_many_stay_separate() -> None:
    alerts = [{"provider": "onprem", "region": "dc1", "site": "rack1", "host": h} for h in ("o1", "o4")]
    groups = group_alerts(alerts, FLEET)
    assert [g.key for g in groups] == ["provider=onprem/region=dc1/site=rack1/host=o1",
                                       "provider=onprem/region=dc1/site=rack1/host=o4"]


def test_path_uses_the_deepest_labels_present() -> None:
    assert path_of({"provider": "edge", "region": "ns", "device": "d1", "resource": "cpu"}) == (
        "provider=edge", "region=ns", "device=d1")
