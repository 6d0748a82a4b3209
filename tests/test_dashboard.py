#!/usr/bin/env python3
"""
test_dashboard.py - the dashboard (GET /, server/ui/) in a real headless
browser: Chromium driven by Selenium (chromium, chromium-driver: Debian
packages; selenium: PyPI, .ci/requirements.txt), against the real server
(tests/test_api.py's Server, the fixtures of tests/fixtures).

- over plain HTTP: GET / (text/html; charset=utf-8, a strict
  Content-Security-Policy, no-store), /ui.js, /ui.css, HEAD, 405 for POST;
- "main" (no key): the page loads with no console error (log level SEVERE),
  the model table lists both models with their family, parameters, device
  and precision, the spans picture loads; a streamed generation appears
  token by token (the output's text is seen growing, and ends as the `done`
  event's text); a scored text gets a coloured token for each of
  /v1/completions' tokens, titled with its log-probability and
  alternatives; clicking a token in the attention view shades the keys of
  its row (the weights /v1/attention gives for that head); sessions are
  listed and deleted; the metrics strip shows numbers;
- "auth" (--api-key): the page shows the 401 message and no model until the
  key is entered, then lists the models and generates;
- "jobs" (--jobs-listen, --admin-key): the jobs listener's page (GET / there)
  asks for the admin key, uploads a text, submits a tiny job on the CPU and
  follows its event stream until it succeeds (progress lines, the progress
  bar, the training picture), submitted with deploy (the deployed model is
  named, and served on the main listener); its history drawn by the page as
  inline SVG: the loss and validation bpc curves (a point per train line,
  per evaluation), the spans per layer at a step chosen by a slider (max:
  the train lines - 1; Home, arrows; the bars are that line's spans; the
  step announced as text) and Play/Pause stepping through it; then a tiny
  PAR job followed from its row (a bar per block and choice: its
  arch_weights), and the jobs page on a phone-sized screen;
- "models" (on "main"): a copy of the fixture in --model-dir loaded from the
  page under a new name, listed and offered, the API's refusals (409 name
  taken, 400 outside the directory or no such file) shown with the API's
  messages, then unloaded from its row (gone from the server and the table).

Screenshots go to build/dashboard/ (models.png, playground.png,
attention.png, sessions.png, models-load.png, auth.png, phone.png, jobs.png,
jobs-phone.png); with DASHBOARD_DOCS=1 (by hand, not in make test: a test
writes nothing into the checkout) models.png and playground.png are also
copied to docs/dashboard-models.png and docs/dashboard-playground.png, the
README's pictures.

Without Chromium, chromedriver or selenium it prints a SKIP line naming what
to install and passes nothing. Ends with `test_dashboard.py: N passed, N
failed`; exit status 1 on failure.
"""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as T  # noqa: E402
from test_api import Server, check, call  # noqa: E402

ROOT = T.ROOT
SHOTS = os.path.join(ROOT, "build", "dashboard")
DOCS = os.path.join(ROOT, "docs")
KEY = "dash-key-1"
ADMIN = "dash-admin-1"


def summary():
    print(f"test_dashboard.py: {T.PASS} passed, {T.FAIL} failed")
    return 1 if T.FAIL else 0


def find_browser():
    """(selenium webdriver module, chromium path, chromedriver path), or a SKIP reason."""
    missing = []
    try:
        from selenium import webdriver  # noqa: F401
    except ImportError:
        missing.append("selenium (python3 -m pip install selenium)")
        webdriver = None
    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if not chrome:
        missing.append("chromium (apt-get install chromium)")
    if not driver:
        missing.append("chromedriver (apt-get install chromium-driver)")
    return (webdriver, chrome, driver), missing


def start_browser(webdriver, chrome, driver, width=1280, height=1000):
    """Chromium (headless) with a profile directory of its own, by which
    close_browser finds its processes if it will not quit."""
    import tempfile
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="spanserve-chromium-")
    o = webdriver.ChromeOptions()
    o.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}", "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(driver), options=o)
    except Exception:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    drv.spanserve_profile = profile
    return drv


def close_browser(drv):
    """Quits DRV after the page's requests end; a browser that does not
    answer (a page stuck in its script) is killed, with every process of
    its profile, so that no test leaves one running."""
    import signal
    try:
        idle(drv)
        drv.quit()
    except Exception as e:
        check("the browser quits", False, f"{type(e).__name__}: {e}")
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if drv.spanserve_profile.encode() in f.read():
                        os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        try:
            drv.service.stop()
        except Exception:
            pass
    shutil.rmtree(drv.spanserve_profile, ignore_errors=True)


def wait(fn, timeout=20, step=0.05):
    """FN's first truthy value within TIMEOUT seconds, else None."""
    end = time.time() + timeout
    while True:
        try:
            v = fn()
        except Exception:
            v = None
        if v or time.time() > end:
            return v
        time.sleep(step)


def idle(drv):
    """Waits until the page has no request waiting for its answer (aria-busy),
    so that leaving the page abandons nothing in the middle."""
    wait(lambda: drv.execute_script("return document.body.getAttribute('aria-busy') !== 'true'"), 30)


def severe(drv, allow=()):
    """The SEVERE console entries since the last call, except those matching ALLOW."""
    return [e["message"] for e in drv.get_log("browser")
            if e.get("level") == "SEVERE" and not any(a in e["message"] for a in allow)]


def shot(drv, name):
    os.makedirs(SHOTS, exist_ok=True)
    p = os.path.join(SHOTS, name)
    drv.save_screenshot(p)
    return p


def full_shot(drv, name, element_id=None):
    """A screenshot of the section ELEMENT_ID scrolled into view (or the top)."""
    if element_id:
        drv.execute_script("document.getElementById(arguments[0]).scrollIntoView()", element_id)
    else:
        drv.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.3)
    return shot(drv, name)


# ---------------------------------------------------------------- plain HTTP


def http_checks(S):
    T.CURRENT = "http"
    r = call(S.port, "GET", "/")
    h = r.headers
    check("GET / 200 html", r.status == 200 and h.get("content-type") == "text/html; charset=utf-8", f"{r.status} {h}")
    csp = h.get("content-security-policy", "")
    check("GET / CSP", "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
          and "frame-ancestors 'none'" in csp, csp)
    check("GET / no-store", h.get("cache-control") == "no-store", f"{h}")
    body = r.body.decode()
    check("GET / the page", "<title>spanserve dashboard</title>" in body and '<script src="/ui.js"' in body
          and "<script>" not in body and "http://" not in body and "https://" not in body, body[:200])
    for path, ctype, needle in (("/ui.js", "text/javascript; charset=utf-8", "async function generate"),
                                ("/ui.css", "text/css; charset=utf-8", ":focus-visible")):
        r = call(S.port, "GET", path)
        check(f"GET {path}", r.status == 200 and r.headers.get("content-type") == ctype
              and needle in r.body.decode() and r.headers.get("x-content-type-options") == "nosniff", f"{r.status} {r.headers}")
        # the SVG namespace (document.createElementNS) names no resource: nothing is fetched from it
        rest = r.body.replace(b'"http://www.w3.org/2000/svg"', b"")
        check(f"{path}: nothing from elsewhere", b"http://" not in rest and b"https://" not in rest
              and b"@import" not in rest)
    r = call(S.port, "HEAD", "/")
    check("HEAD /", r.status == 200 and r.body == b"" and r.headers.get("content-type", "").startswith("text/html"), f"{r}")
    for m in ("POST", "PUT", "DELETE"):
        r = call(S.port, m, "/", b"{}" if m != "DELETE" else None)
        allow = {a.strip() for a in r.headers.get("allow", "").split(",")}
        check(f"{m} / 405", r.status == 405 and {"GET", "HEAD"} <= allow and T.has_error_shape(r, 405), f"{r} {r.headers}")
    r = call(S.port, "GET", "/ui.js/x")
    check("GET /ui.js/x 404", r.status == 404, f"{r}")


# ---------------------------------------------------------------- the page


def page_checks(S, drv):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    T.CURRENT = "page"
    base = f"http://127.0.0.1:{S.port}/"
    drv.get(base)
    rows = wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 2 and
                drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr"))
    check("the model table lists both models", rows, drv.find_element(By.ID, "model-table").text)
    api = {m["name"]: m for m in (S.call("GET", "/v1/models").json or {}).get("data", [])}
    table = drv.find_element(By.ID, "model-table").text
    for name, m in api.items():
        check(f"model {name} in the table", name in table and m["family"] in table and m["device"] in table
              and m["precision"] in table, table)
    check("parameters shown", any(r.find_elements(By.CSS_SELECTOR, "td")[3].get_attribute("title") == str(api["aspan"]["parameters"])
                                  for r in (rows or [])), table)
    loaded = wait(lambda: drv.execute_script(
        "const i = document.getElementById('spans-img'); return i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:')"))
    check("the spans picture loads", loaded)
    ok = wait(lambda: drv.find_element(By.ID, "m-requests").text not in ("", "–"))
    check("the metrics strip shows numbers", ok, drv.find_element(By.ID, "metrics").text)
    check("model selects filled", {o.get_attribute("value") for o in Select(drv.find_element(By.ID, "g-model")).options}
          == set(api), "")
    full_shot(drv, "models.png")
    if os.environ.get("DASHBOARD_DOCS"):
        shutil.copy(os.path.join(SHOTS, "models.png"), os.path.join(DOCS, "dashboard-models.png"))

    # ---- a streamed generation, seen growing
    T.CURRENT = "generate"
    drv.find_element(By.ID, "g-prompt").clear()
    drv.find_element(By.ID, "g-prompt").send_keys("ROMEO:\n")
    for fid, v in (("g-max", "1500"), ("g-seed", "7"), ("g-temp", "0.8")):
        e = drv.find_element(By.ID, fid)
        e.clear()
        e.send_keys(v)
    # the output's text length at every change the page makes (a MutationObserver)
    drv.execute_script("""
        window.__lens = [];
        new MutationObserver(() => window.__lens.push(document.getElementById('gen-out').textContent.length))
            .observe(document.getElementById('gen-out'), {childList: true, subtree: true, characterData: true});""")
    drv.find_element(By.ID, "g-go").click()
    done = wait(lambda: drv.execute_script("return document.getElementById('gen-out').dataset.done === '1'"), 60)
    check("the generation ends", done, drv.find_element(By.ID, "gen-status").text)
    lens = [x for x in drv.execute_script("return window.__lens") if x > 0]
    distinct = sorted(set(lens))
    check("the text grows token by token", len(distinct) >= 3 and lens == sorted(lens), f"lengths {distinct[:20]}")
    out = drv.find_element(By.ID, "gen-out")
    n_spans = len(out.find_elements(By.TAG_NAME, "span"))
    text = drv.execute_script("return document.getElementById('gen-out').textContent")
    r = S.call("POST", "/v1/generate", {"model": "aspan", "prompt": "ROMEO:\n", "max_tokens": 1500, "seed": 7,
                                        "temperature": 0.8})
    want = (r.json or {}).get("text")
    check("the streamed text is the generation's", text == want, f"{text[:80]!r} vs {str(want)[:80]!r}")
    check("a span per token", n_spans == len((r.json or {}).get("tokens", [])) or n_spans >= len(want or "") * 0.9,
          f"{n_spans} spans")
    check("status says done", "done" in drv.find_element(By.ID, "gen-status").text, drv.find_element(By.ID, "gen-status").text)

    # ---- a scored text: coloured tokens with their log-probabilities
    T.CURRENT = "score"
    sample = "First Citizen:\nBefore we proceed any further, hear me speak."
    drv.find_element(By.ID, "g-prompt").clear()
    drv.find_element(By.ID, "g-prompt").send_keys(sample)
    drv.find_element(By.ID, "s-go").click()
    toks = wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#score-out span.tok"))
    ref = S.call("POST", "/v1/completions", {"model": "aspan", "prompt": sample, "echo": True, "logprobs": 5,
                                             "max_tokens": 0}).json
    lp = ref["choices"][0]["logprobs"] if ref else {"tokens": [], "token_logprobs": []}
    check("a token per token", toks and len(toks) == len(lp["tokens"]), f"{len(toks or [])} vs {len(lp['tokens'])}")
    if toks and len(toks) == len(lp["tokens"]):
        t5 = toks[5]
        title = t5.get_attribute("title")
        bg = t5.value_of_css_property("background-color")
        check("token title: its logprob", f"{lp['token_logprobs'][5]:.3f}" in title and "bits" in title and "likeliest" in title,
              title)
        check("token coloured", bg not in ("rgba(0, 0, 0, 0)", "transparent", ""), bg)
        colours = {t.value_of_css_property("background-color") for t in toks[1:]}
        check("colours differ by surprise", len(colours) > 3, f"{colours}")
        check("tokens' text is the text", "".join(t.text for t in toks).replace("\n", "") == sample.replace("\n", ""), "")
        # focus shows the info line (keyboard)
        drv.execute_script("arguments[0].focus()", t5)
        info = wait(lambda: drv.find_element(By.ID, "tok-info").text)
        check("focus shows the token's info", info and "log p" in info, f"{info!r}")
    full_shot(drv, "playground.png", "gen-h")
    if os.environ.get("DASHBOARD_DOCS"):
        shutil.copy(os.path.join(SHOTS, "playground.png"), os.path.join(DOCS, "dashboard-playground.png"))

    # ---- attention: click a scored token, the keys of its row are shaded
    T.CURRENT = "attention"
    q = 20
    if toks and len(toks) > q:
        toks[q].click()
        att = wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#att-tokens span.tok.sel"), 30)
        check("clicking a scored token selects it in the attention view", att, drv.find_element(By.ID, "att-status").text)
        layer = int(Select(drv.find_element(By.ID, "a-layer")).first_selected_option.get_attribute("value"))
        head = int(Select(drv.find_element(By.ID, "a-head")).first_selected_option.get_attribute("value"))
        ref = S.call("POST", "/v1/attention", {"model": "aspan", "text": sample, "layer": layer, "head": head}).json or {}
        row = next((r for r in ref["heads"][0]["rows"] if r["query"] == q), None) if ref.get("heads") else None
        spans = drv.find_elements(By.CSS_SELECTOR, "#att-tokens span.tok")
        shaded = {i for i, s in enumerate(spans) if (s.get_attribute("title") or "").startswith("weight")}
        want_keys = {k for k, w in zip(row["keys"], row["weights"])} if row else set()
        check("the shaded keys are the row's", row and shaded == want_keys, f"{sorted(shaded)} vs {sorted(want_keys)}")
        if row and row["keys"]:
            k, w = max(zip(row["keys"], row["weights"]), key=lambda kw: kw[1])
            check("the heaviest key's title is its weight", spans[k].get_attribute("title") == f"weight {w:.4f}",
                  spans[k].get_attribute("title"))
            lst = drv.find_element(By.ID, "att-list").text
            check("the weight list", f"{w:.4f}" in lst, lst)
        # another head through the selects and the keyboard
        heads = Select(drv.find_element(By.ID, "a-head"))
        if len(heads.options) > 1:
            heads.select_by_index(1)
            drv.find_element(By.ID, "a-go").click()
            wait(lambda: "click a token" in drv.find_element(By.ID, "att-status").text, 30)
            sp = drv.find_elements(By.CSS_SELECTOR, "#att-tokens span.tok")
            drv.execute_script("arguments[0].focus()", sp[q])
            from selenium.webdriver.common.keys import Keys
            sp[q].send_keys(Keys.ENTER)
            check("Enter on a token selects it", wait(lambda: "sel" in sp[q].get_attribute("class")), "")
        img = wait(lambda: drv.execute_script(
            "const i = document.getElementById('att-img'); return i.complete && i.naturalWidth > 0"), 20)
        check("the head's heat map loads", img)
        full_shot(drv, "attention.png", "attention")

    # ---- sessions: create, listed, inspect, delete
    T.CURRENT = "sessions"
    drv.find_element(By.ID, "n-id").send_keys("dash-s1")
    drv.find_element(By.CSS_SELECTOR, "#sess-new button[type=submit]").click()
    row = wait(lambda: [r for r in drv.find_elements(By.CSS_SELECTOR, "#sess-table tbody tr") if "dash-s1" in r.text])
    check("a new session is listed", row, drv.find_element(By.ID, "sess-status").text)
    check("the session is the server's", S.call("GET", "/v1/sessions/dash-s1").status == 200)
    if row:
        row[0].find_element(By.XPATH, ".//button[text()='Inspect']").click()
        d = wait(lambda: drv.find_element(By.ID, "sess-detail").text)
        check("inspect shows the session", d and json.loads(d).get("id") == "dash-s1", f"{d!r}")
        row[0].find_element(By.XPATH, ".//button[text()='Export']").click()
        ex = wait(lambda: "exported dash-s1" in drv.find_element(By.ID, "sess-status").text)
        check("export fetches the state", ex, drv.find_element(By.ID, "sess-status").text)
        # import: the state of dash-s1 (from the API) as a new session of aspan
        st = S.call("GET", "/v1/sessions/dash-s1/state")
        path = os.path.join(S.tmp, "dash-s1.state")
        with open(path, "wb") as f:
            f.write(st.body)
        drv.find_element(By.ID, "i-file").send_keys(path)
        drv.find_element(By.ID, "i-id").send_keys("dash-s2")
        Select(drv.find_element(By.ID, "i-model")).select_by_value("aspan")
        drv.find_element(By.CSS_SELECTOR, "#sess-import button[type=submit]").click()
        imp = wait(lambda: "imported dash-s2" in drv.find_element(By.ID, "sess-status").text)
        check("import makes the session", imp and S.call("GET", "/v1/sessions/dash-s2").status == 200,
              drv.find_element(By.ID, "sess-status").text)
        check("the imported session is listed", wait(lambda: "dash-s2" in drv.find_element(By.ID, "sess-table").text))
        full_shot(drv, "sessions.png", "sessions")
        row = [r for r in drv.find_elements(By.CSS_SELECTOR, "#sess-table tbody tr") if "dash-s1" in r.text]
        drv.execute_script("window.confirm = () => true")
        row[0].find_element(By.XPATH, ".//button[text()='Delete']").click()
        gone = wait(lambda: S.call("GET", "/v1/sessions/dash-s1").status == 404)
        check("delete deletes it", gone)
        check("and it leaves the table", wait(lambda: "dash-s1" not in drv.find_element(By.ID, "sess-table").text))

    # ---- models: load one from --model-dir under a new name, see it, unload it
    model_checks(S, drv)

    # ---- a phone-sized screen: nothing wider than it
    T.CURRENT = "phone"
    idle(drv)
    drv.set_window_size(390, 844)
    drv.get(base)
    wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 2)
    idle(drv)
    w = drv.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    check("no horizontal scroll on a phone", w[0] <= w[1] + 1, f"{w}")
    full_shot(drv, "phone.png")
    # every control has a label
    unlabelled = drv.execute_script("""
        return [...document.querySelectorAll('input, select, textarea')].filter(e =>
            !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id || e.outerHTML)""")
    check("every control is labelled", not unlabelled, f"{unlabelled}")
    errs = severe(drv)
    check("no console errors", not errs, f"{errs}")


def model_checks(S, drv):
    """POST /v1/models from the page (a copy of the fixture in --model-dir, a
    new name), listed; the API's errors shown; DELETE from the row's button."""
    from selenium.webdriver.common.by import By
    T.CURRENT = "models"
    os.makedirs(os.path.join(S.model_dir, "copies"), exist_ok=True)
    shutil.copy(T.A_PATH, os.path.join(S.model_dir, "copies", "a.safetensors"))
    drv.execute_script("window.confirm = () => true")
    status = lambda: drv.find_element(By.ID, "load-status").text  # noqa: E731

    def load(name, path):
        for fid, v in (("l-name", name), ("l-path", path), ("l-url", "")):
            e = drv.find_element(By.ID, fid)
            e.clear()
            if v:
                e.send_keys(v)
        drv.execute_script("document.getElementById('load-status').textContent = ''")
        drv.find_element(By.ID, "l-go").click()
        return wait(lambda: (lambda t: t if t and not t.startswith("loading") else None)(status()), 30)

    msg = load("dash-loaded", "copies/a.safetensors")
    check("load: the status names the model", msg and msg.startswith("loaded dash-loaded"), f"{msg!r}")
    row = wait(lambda: [r for r in drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr") if "dash-loaded" in r.text])
    check("load: the model is listed", row, drv.find_element(By.ID, "model-table").text)
    r = S.call("GET", "/v1/models/dash-loaded")
    check("load: the server has it", r.status == 200 and (r.json or {}).get("family") == "adaptive-span", f"{r}")
    check("load: the selects offer it", "dash-loaded" in [o.get_attribute("value") for o in
                                                        drv.find_elements(By.CSS_SELECTOR, "#g-model option")])
    # the API's refusals, with its messages
    for label, name, path, code in (("a name taken", "aspan", "copies/a.safetensors", 409),
                                    ("a path outside the model directory", "dash-x", "../x.safetensors", 400),
                                    ("no such file", "dash-y", "copies/none.safetensors", None)):
        ref = S.call("POST", "/v1/models", {"name": name + "-ref" if code != 409 else name, "path": path})
        want = f"HTTP {ref.status}: " + ((ref.json or {}).get("error") or {}).get("message", "")
        msg = load(name, path)
        check(f"load {label}: the API's error shown", (code is None or ref.status == code) and ref.status >= 400
              and msg == want.replace(name + "-ref", name), f"{msg!r} vs {want!r}")
    errs = severe(drv, allow=("status of 409", "status of 400"))   # the refused loads' own answers
    check("no console errors but the refused loads'", not errs, f"{errs}")
    check("a refused load leaves the table", len(drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 3)
    row = [r for r in drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr") if "dash-loaded" in r.text]
    btn = row[0].find_element(By.XPATH, ".//button[text()='Unload']") if row else None
    check("the row's Unload button is labelled", btn is not None and btn.get_attribute("aria-label") == "unload model dash-loaded")
    if btn is not None:
        btn.click()
        check("unload: the status says so", wait(lambda: status() == "unloaded dash-loaded"), status())
        check("unload: the server no longer has it", wait(lambda: S.call("GET", "/v1/models/dash-loaded").status == 404))
        check("unload: it leaves the table", wait(lambda: "dash-loaded" not in drv.find_element(By.ID, "model-table").text
                                                  and len(drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 2))
    full_shot(drv, "models-load.png", "models")
    r = S.call("DELETE", "/v1/models/dash-loaded")
    check("unloading twice: 404 from the API", r.status == 404, f"{r}")


def auth_checks(S, drv):
    from selenium.webdriver.common.by import By
    T.CURRENT = "auth"
    drv.get(f"http://127.0.0.1:{S.port}/")
    shown = wait(lambda: drv.find_element(By.ID, "auth-msg").is_displayed())
    check("without the key: the 401 message", shown and "API key" in drv.find_element(By.ID, "auth-msg").text,
          drv.find_element(By.ID, "auth-msg").text)
    check("without the key: no model", not drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr"))
    shot(drv, "auth.png")
    drv.find_element(By.ID, "key").send_keys("wrong")
    drv.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    time.sleep(0.5)
    check("a wrong key: still the message, no model", drv.find_element(By.ID, "auth-msg").is_displayed()
          and not drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr"))
    drv.find_element(By.ID, "key").clear()
    drv.find_element(By.ID, "key").send_keys(KEY)
    drv.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    rows = wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 2)
    check("with the key: the models", rows)
    check("with the key: the message goes", wait(lambda: not drv.find_element(By.ID, "auth-msg").is_displayed()))
    check("the key is kept in sessionStorage", drv.execute_script("return sessionStorage.getItem('spanserve-key')") == KEY)
    e = drv.find_element(By.ID, "g-max")
    e.clear()
    e.send_keys("20")
    drv.find_element(By.ID, "g-go").click()
    done = wait(lambda: drv.execute_script("return document.getElementById('gen-out').dataset.done === '1'"), 30)
    check("with the key: a generation", done and len(drv.find_element(By.ID, "gen-out").text) > 0,
          drv.find_element(By.ID, "gen-status").text)
    # a reload keeps the key (sessionStorage) and asks for nothing
    idle(drv)
    drv.refresh()
    check("after a reload: the models, no message",
          wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 2)
          and not drv.find_element(By.ID, "auth-msg").is_displayed())
    # the only console errors: the 401s of the requests made without the key
    errs = severe(drv, allow=("status of 401",))
    check("no console errors but the 401s", not errs, f"{errs}")


def jobs_checks(S, drv):
    """The jobs listener's page: the admin key, an upload, a job submitted
    and followed through its event stream to the end."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    T.CURRENT = "jobs"
    r = call(S.jport, "GET", "/")
    check("jobs listener: GET / is the jobs page", r.status == 200 and b"<title>spanserve training jobs</title>" in r.body
          and "script-src 'self'" in r.headers.get("content-security-policy", ""), f"{r.status}")
    check("jobs listener: /ui.js", call(S.jport, "GET", "/ui.js").status == 200)
    drv.get(f"http://127.0.0.1:{S.jport}/")
    shown = wait(lambda: drv.find_element(By.ID, "auth-msg").is_displayed())
    check("without the admin key: the 401 message", shown and "admin key" in drv.find_element(By.ID, "auth-msg").text)
    drv.find_element(By.ID, "key").send_keys(ADMIN)
    drv.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    check("with the admin key: the message goes", wait(lambda: not drv.find_element(By.ID, "auth-msg").is_displayed()))
    path = os.path.join(S.tmp, "input.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(T.TEXT[:20000])
    drv.find_element(By.ID, "f-file").send_keys(path)
    drv.find_element(By.ID, "f-name").send_keys("shakespeare.txt")
    drv.find_element(By.CSS_SELECTOR, "#f-form button[type=submit]").click()
    up = wait(lambda: "uploaded file-" in drv.find_element(By.ID, "f-status").text)
    check("upload", up, drv.find_element(By.ID, "f-status").text)
    files = call(S.jport, "GET", "/v1/files", key=ADMIN).json or {}
    check("the file is the server's", [f["characters"] for f in files.get("files", [])] == [20000], f"{files}")
    Select(drv.find_element(By.ID, "j-device")).select_by_value("cpu")
    drv.find_element(By.ID, "j-name").send_keys("dash-model")
    drv.find_element(By.ID, "j-deploy").click()
    drv.find_element(By.CSS_SELECTOR, "#j-form button[type=submit]").click()
    check("submitted", wait(lambda: "submitted" in drv.find_element(By.ID, "j-status").text), drv.find_element(By.ID, "j-status").text)
    ended = wait(lambda: drv.execute_script("return document.getElementById('follow-log').dataset.ended === '1'"), 180, 0.2)
    status = drv.find_element(By.ID, "follow-status").text
    check("the job is followed to its end", ended and status.startswith("succeeded"), status)
    log = drv.find_element(By.ID, "follow-log").text.splitlines()
    events = [json.loads(x).get("event") for x in log if x.startswith("{")]
    check("its progress lines", "train" in events and events[-1] == "done", f"{events}")
    jobs = (call(S.jport, "GET", "/v1/jobs", key=ADMIN).json or {}).get("jobs", [])
    check("the server's job", len(jobs) == 1 and jobs[0]["status"] == "succeeded" and jobs[0]["name"] == "dash-model", f"{jobs}")
    prog = drv.execute_script("const p = document.getElementById('follow-progress'); return [p.value, p.max]")
    check("progress full", prog[0] == prog[1] and prog[1] == jobs[0]["steps"] if jobs else False, f"{prog}")
    check("the table says succeeded", wait(lambda: "succeeded" in drv.find_element(By.ID, "jobs-table").text))
    img = wait(lambda: drv.execute_script(
        "const i = document.getElementById('follow-img'); return i.complete && i.naturalWidth > 0"), 20)
    check("the training picture loads", img)
    history_checks(S, drv, jobs[0] if jobs else None)
    full_shot(drv, "jobs.png", "follow-h")
    par_checks(S, drv)
    live_checks(S, drv)
    errs = severe(drv, allow=("status of 401",))
    check("no console errors but the 401s", not errs, f"{errs}")


def history_checks(S, drv, job):
    """The followed job's history drawn client-side: the loss and validation
    bpc curves (inline SVG), the spans of each recorded step behind a slider
    and a Play button; the deployed model named."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    T.CURRENT = "jobs-history"
    if not job:
        check("a job to look at", False)
        return
    fm = drv.find_element(By.ID, "follow-model")
    check("the deployed model is named", fm.is_displayed() and "dash-model" in fm.text and "deployed" in fm.text, fm.text)
    check("and the main listener serves it", S.call("GET", "/v1/models/dash-model").status == 200)
    lines = (call(S.jport, "GET", f"/v1/jobs/{job['id']}/events?limit=10000", key=ADMIN).json or {}).get("events", [])
    lines = [json.loads(x) if isinstance(x, str) else x for x in lines]
    train = [x for x in lines if x.get("event") == "train"]
    evals = {x["step"] for x in lines if x.get("event") in ("train", "done") and isinstance(x.get("val_bpc"), (int, float))}
    pts = drv.execute_script("""return ['loss-chart', 'bpc-chart'].map(id => {
        const s = document.querySelector('#' + id + ' svg');
        return s ? [s.namespaceURI, Number(s.getAttribute('data-points')), s.querySelectorAll('circle').length,
                    (s.querySelector('polyline') || {getAttribute: () => ''}).getAttribute('points').split(' ').length] : null; })""")
    check("the curves are inline SVG", pts[0] and pts[1] and pts[0][0] == pts[1][0] == "http://www.w3.org/2000/svg", f"{pts}")
    if pts[0] and pts[1]:
        check("the loss curve: a point per train line, at least 2", pts[0][1] == pts[0][2] == pts[0][3] == len(train) >= 2,
              f"{pts[0]} vs {len(train)} train lines")
        check("the val bpc curve: a point per evaluation, at least 2", pts[1][1] == pts[1][2] == len(evals) >= 2,
              f"{pts[1]} vs {sorted(evals)}")
    last = train[-1] if train else {}
    title = drv.execute_script("const c = document.querySelectorAll('#loss-chart circle'); return c.length ? c[c.length - 1].textContent : ''")
    check("the last loss point is the last train line's", last and title == f"step {last['step']}: {last['loss']:.4f}",
          f"{title!r} vs {last.get('step')} {last.get('loss')}")
    # the slider over the recorded history
    sl = drv.find_element(By.ID, "anim-step")
    check("the slider is labelled", drv.execute_script("return arguments[0].labels.length", sl) == 1)
    check("the slider's max: the history's entries - 1", int(sl.get_attribute("max")) == len(train) - 1,
          f"{sl.get_attribute('max')} vs {len(train)} entries")
    check("after the end the slider shows the last step", int(sl.get_attribute("value")) == len(train) - 1,
          sl.get_attribute("value"))
    bars = lambda: drv.execute_script(  # noqa: E731
        "return [...document.querySelectorAll('#anim-chart rect.bar')].map(r => r.getAttribute('width'))")
    text = lambda: drv.find_element(By.ID, "anim-text").text  # noqa: E731
    n_layers = len(last.get("spans") or [])
    end_bars = bars()
    check("a bar per layer and statistic (mean, max)", len(end_bars) == 2 * n_layers and n_layers > 0, f"{end_bars}")
    check("the step announced as text", text().startswith(f"step {last.get('step')} ({len(train)} of {len(train)})")
          and sl.get_attribute("aria-valuetext") == f"step {last.get('step')}", text())
    drv.execute_script("arguments[0].focus()", sl)
    sl.send_keys(Keys.HOME)
    check("Home: the first entry", wait(lambda: sl.get_attribute("value") == "0"), sl.get_attribute("value"))
    first = train[0] if train else {}
    check("moving the slider redraws the bars", wait(lambda: bars() != end_bars and len(bars()) == len(end_bars)),
          f"{bars()} vs {end_bars}")
    want = [v for s_ in first.get("spans", []) for v in (s_["mean"], s_["max"])]
    got = [float(x) for x in drv.execute_script(
        "return [...document.querySelectorAll('#anim-chart rect.bar')].map(r => r.textContent.split(' ').pop())")]
    check("the bars are the first train line's spans", len(got) == len(want) and all(abs(a - b) < 1e-4 for a, b in zip(got, want)),
          f"{got} vs {want}")
    check("its text announced", text().startswith(f"step {first.get('step')} (1 of {len(train)})"), text())
    sl.send_keys(Keys.ARROW_RIGHT)
    check("an arrow key steps once", wait(lambda: sl.get_attribute("value") == "1") and text().startswith(f"step {train[1]['step']} "),
          f"{sl.get_attribute('value')} {text()}")
    sl.send_keys(Keys.HOME)
    play = drv.find_element(By.ID, "anim-play")
    play.click()
    check("Play: the button says Pause", wait(lambda: play.text == "Pause", 5), play.text)
    check("Play advances the slider", wait(lambda: int(sl.get_attribute("value")) >= 2, 10), sl.get_attribute("value"))
    play.send_keys(Keys.ENTER)   # the keyboard pauses it
    paused = wait(lambda: play.text == "Play", 5)
    v = sl.get_attribute("value")
    time.sleep(0.8)
    check("Pause stops it", paused and sl.get_attribute("value") == v and int(v) < len(train) - 1, f"{v} {sl.get_attribute('value')}")
    play.click()
    check("Play runs to the last entry and stops", wait(lambda: sl.get_attribute("value") == str(len(train) - 1)
                                                      and play.text == "Play", 15), f"{sl.get_attribute('value')} {play.text}")
    check("the last entry's bars again", bars() == end_bars, f"{bars()} vs {end_bars}")
    drv.execute_script("document.getElementById('follow-h').scrollIntoView()")


def par_checks(S, drv):
    """A tiny PAR job (submitted through the API), followed from its row's
    Follow button: a bar per block and choice (attn, ffn, skip), its
    arch_weights; then the page on a phone-sized screen."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    T.CURRENT = "jobs-par"
    fid = ((call(S.jport, "GET", "/v1/files", key=ADMIN).json or {}).get("files") or [{}])[0].get("id")
    cfg = {"n_blocks": 4, "n_head": 2, "d_model": 16, "d_head": 8, "d_inner": 32, "mem_len": 16, "tgt_len": 16,
           "batch_size": 4, "steps": 120, "search_steps": 60, "log_every": 20, "eval_every": 60, "checkpoint_every": 60,
           "eval_tokens": 500}
    r = call(S.jport, "POST", "/v1/jobs", json.dumps({"id": "dash-par", "family": "par-transformer-xl", "file": fid, "config": cfg,
                                                      "device": "cpu"}).encode(), key=ADMIN)
    check("a PAR job submitted", r.status == 201, f"{r}")
    if r.status != 201:
        return
    drv.find_element(By.ID, "jobs-refresh").click()
    btn = wait(lambda: drv.find_element(By.CSS_SELECTOR, "button[aria-label='follow job dash-par']"))
    check("its row has a Follow button", btn)
    if not btn:
        return
    btn.click()
    check("followed to its end", wait(lambda: drv.execute_script("return document.getElementById('follow-log').dataset.ended === '1'")
                                      and drv.find_element(By.ID, "follow-h").text == "Job dash-par", 180, 0.2)
          and drv.find_element(By.ID, "follow-status").text.startswith("succeeded"), drv.find_element(By.ID, "follow-status").text)
    lines = (call(S.jport, "GET", "/v1/jobs/dash-par/events?limit=10000", key=ADMIN).json or {}).get("events", [])
    lines = [json.loads(x) if isinstance(x, str) else x for x in lines]
    train = [x for x in lines if x.get("event") == "train"]
    sl = drv.find_element(By.ID, "anim-step")
    check("PAR: the slider's max", int(sl.get_attribute("max")) == len(train) - 1, f"{sl.get_attribute('max')} vs {len(train)}")
    check("PAR: the heading says block weights", drv.find_element(By.ID, "anim-h").text == "Block weights over training")
    drv.execute_script("arguments[0].focus()", sl)
    sl.send_keys(Keys.HOME)
    wait(lambda: sl.get_attribute("value") == "0")
    got = [float(x) for x in drv.execute_script(
        "return [...document.querySelectorAll('#anim-chart rect.bar')].map(r => r.textContent.split(' ').pop())")]
    want = [v for w in (train[0].get("arch_weights") or []) for v in w] if train else []
    check("PAR: a bar per block and choice, the first line's arch_weights", len(want) == 3 * cfg["n_blocks"] and len(got) == len(want)
          and all(abs(a - b) < 1e-4 for a, b in zip(got, want)), f"{got} vs {want}")
    pts = drv.execute_script("return ['loss-chart', 'bpc-chart'].map(id => Number(document.querySelector('#' + id + ' svg').getAttribute('data-points')))")
    check("PAR: the curves", pts[0] == len(train) and pts[1] >= 2, f"{pts}")
    # a phone-sized screen: the charts shrink, nothing wider than it
    drv.set_window_size(390, 844)
    time.sleep(0.3)
    w = drv.execute_script("""return [document.documentElement.scrollWidth, window.innerWidth,
        [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
            && !e.closest('.scroll')).slice(0, 8).map(e => e.tagName + '#' + e.id + ' ' + Math.round(e.getBoundingClientRect().right))]""")
    check("jobs page: no horizontal scroll on a phone", w[0] <= w[1] + 1, f"{w}")
    unlabelled = drv.execute_script("""
        return [...document.querySelectorAll('input, select, textarea')].filter(e =>
            !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id || e.outerHTML)""")
    check("jobs page: every control is labelled", not unlabelled, f"{unlabelled}")
    full_shot(drv, "jobs-phone.png", "anim")
    drv.set_window_size(1280, 1000)


def live_checks(S, drv):
    """A long job followed while it runs: the curves and the slider grow
    with its train lines; past 1,200 lines the log keeps its newest 500,
    and again when the job is followed anew (its history at once);
    cancelled from its row."""
    from selenium.webdriver.common.by import By
    T.CURRENT = "jobs-live"
    fid = ((call(S.jport, "GET", "/v1/files", key=ADMIN).json or {}).get("files") or [{}])[0].get("id")
    cfg = {"hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "nb_layers": 2, "attn_span": 32, "block_size": 16,
           "batch_size": 4, "steps": 200000, "log_every": 20, "eval_every": 100000, "checkpoint_every": 100000,
           "eval_tokens": 500}
    r = call(S.jport, "POST", "/v1/jobs", json.dumps({"id": "dash-live", "family": "adaptive-span", "file": fid, "config": cfg,
                                                      "device": "cpu"}).encode(), key=ADMIN)
    check("a long job submitted", r.status == 201, f"{r}")
    if r.status != 201:
        return
    drv.find_element(By.ID, "jobs-refresh").click()
    btn = wait(lambda: drv.find_element(By.CSS_SELECTOR, "button[aria-label='follow job dash-live']"))
    if not btn:
        check("its row has a Follow button", False)
        return
    btn.click()
    pts = lambda: drv.execute_script(  # noqa: E731
        "const s = document.querySelector('#loss-chart svg'); return s ? Number(s.getAttribute('data-points')) : 0")
    n1 = wait(lambda: drv.find_element(By.ID, "follow-h").text == "Job dash-live" and pts() >= 2 and pts(), 60)
    check("while it runs: the loss curve has points", n1 and drv.find_element(By.ID, "follow-status").text.startswith("running"),
          f"{n1} {drv.find_element(By.ID, 'follow-status').text}")
    n2 = wait(lambda: pts() > (n1 or 0) and pts(), 30)
    check("and it grows", n2, f"{n1} then {pts()}")
    sl = drv.find_element(By.ID, "anim-step")
    check("the slider follows the last line", wait(lambda: int(sl.get_attribute("value")) == int(sl.get_attribute("max")) >= 1),
          f"{sl.get_attribute('value')} / {sl.get_attribute('max')}")
    # a long stream (a line every 20 steps): the page keeps the log's newest 500 lines and counts the earlier ones,
    # and answers (each line appended to the whole log and laid out again froze it: the cancel below never came)
    many = wait(lambda: ((call(S.jport, "GET", "/v1/jobs/dash-live", key=ADMIN).json or {}).get("step") or 0) >= 20 * 1200, 120, 0.5)
    check("the job is past 1,200 lines", many)
    kept = wait(lambda: drv.execute_script(
        "const l = document.getElementById('follow-log').textContent.split('\\n'); return l.length > 500 && l.slice(0, 2)"), 30)
    check("the log: its newest 500 lines, the earlier ones counted", kept and kept[0].startswith("(") and
          " earlier lines: GET /v1/jobs/dash-live/events)" in kept[0] and kept[1].startswith("{") and
          drv.execute_script("return document.getElementById('follow-log').textContent.split('\\n').length") == 502, f"{kept}")
    # followed again while it runs: its history (past 1,200 lines) comes at once, and the same newest 500 are kept
    check("followed again", wait(lambda: drv.find_element(By.CSS_SELECTOR, "button[aria-label='follow job dash-live']").click()
                                 or True))
    again = wait(lambda: drv.execute_script(
        "const l = document.getElementById('follow-log').textContent.split('\\n');"
        "return l.length === 502 && l[0].startsWith('(') && Number(l[0].slice(1).split(' ')[0]) >= 700 && l[0]"), 30)
    check("its replayed history: the newest 500 lines, the earlier ones counted", again, f"{again}")
    drv.find_element(By.CSS_SELECTOR, "button[aria-label='cancel job dash-live']").click()
    ended = wait(lambda: drv.execute_script("return document.getElementById('follow-log').dataset.ended === '1'"), 60, 0.2)
    check("cancelled from its row, the stream ends", ended and drv.find_element(By.ID, "follow-status").text.startswith("cancelled"),
          drv.find_element(By.ID, "follow-status").text)
    errs = severe(drv, allow=("status of 401",))
    check("no console errors (PAR, live)", not errs, f"{errs}")


def main():
    (webdriver, chrome, driver), missing = find_browser()
    if missing:
        print(f"SKIP test_dashboard.py: no {', '.join(missing)}")
        return summary()
    if not os.path.exists(T.BIN):
        print(f"SKIP test_dashboard.py: no server binary at {T.BIN} (make)")
        return summary()
    for name, keys, fn in (("dash", (), page_checks), ("dash-auth", (KEY,), auth_checks), ("dash-jobs", (KEY,), jobs_checks)):
        S = Server(name, keys=keys)
        T.CURRENT = name
        if fn is jobs_checks:
            S.jport = T.free_port()
            data = os.path.join(S.tmp, "data")
            os.makedirs(data)
            S.extra = ["--jobs-listen", f"127.0.0.1:{S.jport}", "--admin-key", ADMIN, "--data-dir", data]
        err = S.start()
        check("server starts", err is None, f"{err}")
        if err:
            continue
        drv = None
        try:
            if not keys:
                http_checks(S)
            drv = start_browser(webdriver, chrome, driver)
            fn(S, drv)
        except Exception as e:
            import traceback
            check("exception", False, f"{type(e).__name__}: {e} {traceback.format_exc(limit=4)!r}")
        finally:
            if drv is not None:
                close_browser(drv)
            T.finish(S)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
