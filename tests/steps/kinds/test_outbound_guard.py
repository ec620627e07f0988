"""Tools cannot reach inside: every loopback and private spelling, the metadata address and
IPv4-mapped IPv6 are refused before a byte is sent, with the same error a closed port gives;
an operator's allow list lets chosen hosts through; credentials never sit in a tool URL."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from orchestrator_core.outbound import AllowList, refused, why_refused
from orchestratord.runtime import Orchestrator
from test_harness.fake_tools import FakeToolServer, refused_url
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import started_client, wait_status
from tests.steps.kinds.test_tool_call import call, http_tool, run_with

REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.3.4", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "private"),
    ("169.254.169.254", "metadata"),
    ("100.100.100.200", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("169.254.1.1", "link_local"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link_local"),
    ("fd12:3456::1", "private"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "metadata"),
    ("2002:7f00:1::", "loopback"),  # 6to4 carrying 127.0.0.1
    ("240.0.0.1", "reserved"),
]


@pytest.mark.parametrize(("address", "reason"), REFUSED)
def test_an_inside_address_is_refused_with_its_reason(address: str, reason: str) -> None:
    assert why_refused(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_a_public_address_is_not(address: str) -> None:
    assert why_refused(ipaddress.ip_address(address)) is None


def test_the_allow_list_takes_names_and_networks() -> None:
    allow = AllowList.parse(["10.1.0.0/16", "Tools.Internal.", "::1"])
    ten = [ipaddress.ip_address("10.1.2.3")]
    assert refused("x", ten, allow) is None
    assert refused("x", [ipaddress.ip_address("10.2.0.1")], allow) == "private"
    assert refused("tools.internal", [ipaddress.ip_address("10.9.9.9")], allow) is None
    assert refused("x", [ipaddress.ip_address("::1")], allow) is None
    # every address of a name is checked: one public and one inside is refused
    mixed = [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("127.0.0.1")]
    assert refused("x", mixed, AllowList()) == "loopback"
    with pytest.raises(ValueError, match=r"tools\.allow_hosts"):
        AllowList.parse(["not a host/"])


@pytest.fixture
async def tools() -> AsyncIterator[tuple[FakeToolServer, int]]:
    server = FakeToolServer()
    async with serve_app(server.app) as url:
        port = urlsplit(url).port
        assert port is not None
        yield server, port


SPELLINGS = [
    "127.0.0.1",
    "2130706433",  # 127.0.0.1 as one integer
    "0x7f000001",
    "0177.0.0.1",
    "127.1",
    "localhost",
    "[::ffff:127.0.0.1]",
    "0.0.0.0",
    "[::1]",
]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_no_spelling_of_loopback_reaches_a_tool_and_the_error_is_a_closed_port_s(
    db_url: str, tools: tuple[FakeToolServer, int]
) -> None:
    server, port = tools
    settings = make_settings(db_url, tools={"allow_hosts": []})  # the default: nothing inside
    async with started_client(Orchestrator(settings)) as client:
        flow_tools = [
            http_tool(f"t{i}", f"http://{h}:{port}/echo") for i, h in enumerate(SPELLINGS)
        ]
        flow_tools.append(http_tool("closed", refused_url()))
        run_id = await run_with(client, *flow_tools)
        errors = []
        for i in range(len(SPELLINGS)):
            r = await call(client, run_id, f"t{i}", {"x": i}, token=f"c{i}")
            step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
            assert step["status"] == "failed", (SPELLINGS[i], step)
            error = step["error"]
            errors.append((error["code"], error["message"].split(": ", 1)[1]))
        assert server.calls["/echo"] == 0  # nothing was sent
        r = await call(client, run_id, "closed", {}, token="closed")
        closed = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
        # a refused host answers what a closed port answers: a scan learns nothing
        said = closed["error"]
        octal = errors.pop(SPELLINGS.index("0177.0.0.1"))  # httpx refuses to read it at all
        assert octal[1].startswith("bad tool URL")
        assert set(errors) == {(said["code"], said["message"].split(": ", 1)[1])}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_an_allowed_host_is_reached_at_the_address_that_was_checked(
    db_url: str, tools: tuple[FakeToolServer, int]
) -> None:
    server, port = tools
    settings = make_settings(db_url, tools={"allow_hosts": ["localhost"]})
    async with started_client(Orchestrator(settings)) as client:
        run_id = await run_with(client, http_tool("t", f"http://localhost:{port}/echo"))
        r = await call(client, run_id, "t", {"x": 1})
        step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
        assert step["status"] == "succeeded", step.get("error")
        assert step["output"]["result"] == {"x": 1}
        assert server.calls["/echo"] == 1


async def test_the_pinned_request_keeps_the_host_for_the_server_and_tls() -> None:
    from orchestratord.tools.http import HttpToolExecutor, HttpToolSettings

    ex = HttpToolExecutor(HttpToolSettings(allow=AllowList.parse(["localhost"])))
    try:
        request = ex.client.build_request("POST", "https://localhost:8443/x")
        await ex._pin(request)
        assert request.url.host in ("127.0.0.1", "::1")
        assert request.headers["host"] == "localhost:8443"
        assert request.extensions["sni_hostname"] == "localhost"
    finally:
        await ex.aclose()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://user:secret@tools.example/x", "a user or password"),
        ("https://tools.example/x?api_key=abc123", "api_key"),
        ("https://tools.example/x?sig=1&a=b", "sig"),
    ],
)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_credentials_in_a_tool_url_are_refused_at_flow_creation(
    db_url: str, url: str, says: str
) -> None:
    async with started_client(Orchestrator(make_settings(db_url))) as client:
        r = await client.post("/v1/flows", json={"ast": {"u": url}, "tools": [http_tool("t", url)]})
        assert r.status_code == 422, r.text
        error = r.json()
        assert error["details"]["errors"][0]["field"] == "tools[0].executor.url"
        assert says in error["message"]
