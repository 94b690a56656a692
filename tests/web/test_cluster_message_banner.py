"""The cluster message on the dashboard (issue 32): a banner on every page while it is
active, gone once it is cleared or before it starts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from tests.api.test_trial_reports import ok

PATH = "/api/v1/master/cluster_message"
BANNER = 'class="banner cluster-message"'


async def test_every_page_shows_the_active_message(
    web: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    pages = ("/ui/cluster", "/ui/experiments", "/ui/tasks", "/ui/templates", "/ui/models")
    for page in pages:
        assert BANNER not in (await web.get(page)).text
    await ok(admin.put(PATH, json={"message": "Maintenance <Saturday> & Sunday"}))
    for page in pages:
        html = (await web.get(page)).text
        assert BANNER in html, page
        assert "Maintenance &lt;Saturday&gt; &amp; Sunday" in html  # escaped, not markup
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    await ok(admin.put(PATH, json={"message": "Not yet", "startTime": later}))
    assert BANNER not in (await web.get("/ui/cluster")).text
    await ok(admin.put(PATH, json={"message": "Now"}))
    await ok(admin.delete(PATH))
    assert BANNER not in (await web.get("/ui/experiments")).text
