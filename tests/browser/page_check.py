#!/usr/bin/env python3
"""Checks tandem's web page (web/index.html, served at GET /) in a real browser.

Usage: python3 tests/browser/page_check.py BASE_URL ADMIN_TOKEN SCREENSHOT_DIR

Runs headless Chromium through Playwright (sync API) against a running `tandem serve` whose
admin API takes ADMIN_TOKEN:

1. launches Chromium (`/usr/bin/chromium`, or $TANDEM_CHROMIUM) and records console errors
   and page errors;
2. loads BASE_URL/ and waits for the model picker to list a model;
3. sends a prompt that copies text, at temperature 0 and max_tokens 48 set in the settings
   panel, waits for the streamed answer to end, saves SCREENSHOT_DIR/chat.png;
4. checks the answer's runs: at least one span, each with a known `data-source`, their texts
   joined equal to a direct non-streamed API answer to the same messages (greedy output is the
   same streamed or not), and the API's `token_sources` runs concatenating to its content;
5. runs "Compare off/on" on the same prompt and requires the verdict "identical";
6. opens the operator panel, enters ADMIN_TOKEN, moves the lenience slider, applies, waits
   for the page to show the server's new value, checks it through GET /admin/speculation and
   saves SCREENSHOT_DIR/operator.png (the server's lenience is put back afterwards);
7. fails if the page logged any console error or threw.

Exit status 0 when every check passes, 1 on a failed check (the reason on stderr, and
SCREENSHOT_DIR/failure.png when a page was open), 2 on bad usage. Only the standard library
and Playwright are needed.

Environment:
  TANDEM_CHROMIUM      the Chromium executable (default /usr/bin/chromium)
  TANDEM_API_KEY       an API key for a server that requires one (typed into the page too)
  PAGE_CHECK_TIMEOUT_S seconds to wait for one answer (default 180)
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

# A prompt whose answer copies its own text, so prompt lookup has drafts to make.
PROMPT = "Copy this list exactly, one per line: apple, banana, cherry, date, elderberry, fig, grape."
MAX_TOKENS = 48
KNOWN_SOURCES = {"target", "draft", "forced", "correction"}


class CheckFailed(Exception):
    pass


def wait_until(page, predicate, arg=None, timeout=30000):
    """Polls `predicate` (a JavaScript function of `arg`) in the page until it is truthy.

    Playwright's wait_for_function evaluates its predicate with `eval`, which the page's
    Content-Security-Policy (no 'unsafe-eval') rightly forbids; page.evaluate calls the
    function over the DevTools protocol, which the policy does not govern.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = time.monotonic() + timeout / 1000
    while True:
        if page.evaluate(predicate, arg):
            return
        if time.monotonic() > deadline:
            raise PlaywrightTimeout(f"waited {timeout / 1000:.0f} s for {predicate}")
        time.sleep(0.1)


def ok(step, what):
    print(f"ok   step {step}: {what}", flush=True)


def api(base, method, path, body=None, token=None, timeout=120):
    """One HTTP call; returns (status, parsed JSON or raw text)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def error_message(payload):
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return str(payload["error"].get("message", payload))
    return str(payload)


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    base, admin_token, shot_dir = argv[1].rstrip("/"), argv[2], argv[3]
    os.makedirs(shot_dir, exist_ok=True)
    chromium = os.environ.get("TANDEM_CHROMIUM", "/usr/bin/chromium")
    api_key = os.environ.get("TANDEM_API_KEY", "")
    answer_timeout_ms = int(float(os.environ.get("PAGE_CHECK_TIMEOUT_S", "180")) * 1000)

    try:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        print(f"FAILED step 1: Playwright for Python is missing ({e}): pip install playwright", file=sys.stderr)
        return 1
    if not os.path.exists(chromium):
        print(f"FAILED step 1: no Chromium at {chromium} (set TANDEM_CHROMIUM)", file=sys.stderr)
        return 1

    console_errors = []
    restore_lenience = None
    step = 1
    page = None
    try:
        with sync_playwright() as p:
            # 1. browser, with console errors and page errors recorded
            browser = p.chromium.launch(
                executable_path=chromium, headless=True, args=["--no-sandbox"]
            )
            try:
                page = browser.new_page(viewport={"width": 1360, "height": 860})
                page.on(
                    "console",
                    lambda m: console_errors.append(f"console.{m.type}: {m.text}")
                    if m.type == "error"
                    else None,
                )
                page.on("pageerror", lambda e: console_errors.append(f"page error: {e}"))
                ok(step, f"launched {chromium} headless, recording console errors and page errors")

                # 2. the page, with the model picker filled from /v1/models
                step = 2
                if api_key:
                    # the page keeps the key in localStorage: put it there before the first load,
                    # so no request goes out without it
                    page.add_init_script(
                        f"localStorage.setItem('tandem.apiKey', {json.dumps(api_key)})"
                    )
                resp = page.goto(base + "/")
                if resp is None or resp.status != 200:
                    raise CheckFailed(f"GET / answered {resp.status if resp else 'nothing'}")
                try:
                    wait_until(
                        page,
                        "() => document.querySelector('#model-select').options.length > 0",
                        timeout=30000,
                    )
                except PlaywrightTimeout:
                    raise CheckFailed("the model select (#model-select) got no option within 30 s")
                model = page.eval_on_selector("#model-select", "s => s.value")
                ok(step, f"GET / served the page; #model-select lists {model!r}")

                # 3. a streamed answer, with temperature 0 and max_tokens 48 from the settings panel
                step = 3
                page.select_option("#spec-mode", "governed")
                page.fill("#req-temperature", "0")
                page.fill("#req-max-tokens", str(MAX_TOKENS))
                page.fill("#prompt-input", PROMPT)
                page.click("#send-button")
                last = page.locator("#messages .msg-assistant").last
                try:
                    page.wait_for_selector(
                        "#messages .msg-assistant[data-done='1']", timeout=answer_timeout_ms
                    )
                    wait_until(
                        page, "() => !document.querySelector('#send-button').disabled", timeout=10000
                    )
                except PlaywrightTimeout:
                    raise CheckFailed(
                        f"the answer did not finish (data-done=1 on .msg-assistant, Send enabled) "
                        f"within {answer_timeout_ms // 1000} s"
                    )
                page_error = last.locator(".err")
                if page_error.count():
                    raise CheckFailed(f"the page showed an error: {page_error.first.inner_text()}")
                stats = last.locator(".stats").inner_text()
                if "tok/s" not in stats:
                    raise CheckFailed(f"the answer's .stats show no decode tok/s: {stats!r}")
                page.screenshot(path=os.path.join(shot_dir, "chat.png"))
                ok(step, f"streamed answer finished (stats: {' | '.join(stats.split(chr(10)))}); chat.png saved")

                # 4. the page's runs against the API's own answer
                step = 4
                got = page.evaluate(
                    """() => {
                        const msg = [...document.querySelectorAll('#messages .msg-assistant')].pop();
                        const answer = msg.querySelector('.answer');
                        return {
                            whole: answer.textContent,
                            spans: [...answer.querySelectorAll('span')].map(e => ({
                                text: e.textContent,
                                source: e.dataset.source || null,
                                drafter: e.dataset.drafter || null,
                                unreported: e.dataset.unreported === '1',
                            })),
                        };
                    }"""
                )
                spans, answer_text = got["spans"], got["whole"]
                if not spans:
                    raise CheckFailed("the answer has no <span> runs")
                bad = [s for s in spans if s["source"] not in KNOWN_SOURCES]
                if bad:
                    raise CheckFailed(f"spans without a known data-source: {bad[:3]}")
                page_text = "".join(s["text"] for s in spans)
                if page_text != answer_text:
                    raise CheckFailed(
                        f"the .answer holds text outside its spans: spans {page_text!r}, "
                        f"whole {answer_text!r}"
                    )
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": PROMPT}],
                    "temperature": 0,
                    "max_tokens": MAX_TOKENS,
                    "speculative": {"token_sources": True},
                }
                status, answer = api(base, "POST", "/v1/chat/completions", body, api_key)
                note = ""
                if status != 200:
                    raise CheckFailed(
                        f"POST /v1/chat/completions answered {status}: {error_message(answer)}"
                    )
                choice = answer["choices"][0]
                content = choice["message"]["content"]
                if content != page_text:
                    raise CheckFailed(
                        f"the page's answer differs from the API's greedy answer:\n"
                        f"  page: {page_text!r}\n  api:  {content!r}"
                    )
                runs = choice.get("token_sources")
                if runs is None:
                    runs = choice["message"].get("token_sources")
                if runs is None:
                    raise CheckFailed(
                        "the API answer carries no token_sources although the request asked "
                        "for them (choices[0].token_sources)"
                    )
                else:
                    joined = "".join(r.get("text", "") for r in runs)
                    if joined != content:
                        raise CheckFailed(
                            f"the API's token_sources texts do not make its content: "
                            f"{joined!r} vs {content!r}"
                        )
                    unknown = [r for r in runs if r.get("source") not in KNOWN_SOURCES]
                    if unknown:
                        raise CheckFailed(f"API runs with an unknown source: {unknown[:3]}")
                    unreported = [s for s in spans if s["unreported"]]
                    if unreported:
                        raise CheckFailed(
                            f"the server reports token_sources but {len(unreported)} of the page's "
                            f"spans were drawn without them (first: {unreported[0]['text']!r})"
                        )
                counts = {}
                for s in spans:
                    key = s["source"] + (f"/{s['drafter']}" if s["drafter"] else "")
                    counts[key] = counts.get(key, 0) + 1
                ok(
                    step,
                    f"{len(spans)} spans ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}) "
                    f"join to the API's greedy answer of {len(content)} chars{note}",
                )

                # 5. compare off/on: greedy texts identical
                step = 5
                page.fill("#prompt-input", PROMPT)
                page.click("#compare-button")
                try:
                    wait_until(
                        page,
                        "() => ['done', 'failed'].includes(document.querySelector('#compare-verdict').dataset.state)",
                        timeout=2 * answer_timeout_ms,
                    )
                except PlaywrightTimeout:
                    raise CheckFailed("Compare off/on did not finish (#compare-verdict)")
                verdict = page.inner_text("#compare-verdict").strip()
                if verdict != "identical":
                    raise CheckFailed(
                        f"Compare off/on says {verdict!r}; off: "
                        f"{page.inner_text('#compare-off .answer')!r}, on: "
                        f"{page.inner_text('#compare-on .answer')!r}"
                    )
                speedup = page.inner_text("#compare-speedup").strip()
                ok(step, f"Compare off/on: greedy texts {verdict}; {speedup or 'no speedup shown'}")

                # 6. the operator panel changes lenience live
                step = 6
                status, before = api(base, "GET", "/admin/speculation", token=admin_token)
                if status != 200:
                    raise CheckFailed(f"GET /admin/speculation answered {status}: {error_message(before)}")
                current = float(before["lenience"])
                target = 0.35 if abs(current - 0.35) > 1e-9 else 0.6
                page.click("#operator-panel > summary")
                page.fill("#admin-token", admin_token)
                try:
                    wait_until(
                        page,
                        "() => document.querySelector('#admin-lenience-value').dataset.value !== undefined",
                        timeout=15000,
                    )
                except PlaywrightTimeout:
                    raise CheckFailed(
                        f"the operator panel did not load the settings: "
                        f"{page.inner_text('#admin-status')!r}"
                    )
                page.fill("#admin-lenience", str(target))
                page.click("#admin-apply")
                try:
                    wait_until(
                        page,
                        "t => Math.abs(Number(document.querySelector('#admin-lenience-value')"
                        ".dataset.value) - t) < 1e-9",
                        arg=target,
                        timeout=15000,
                    )
                except PlaywrightTimeout:
                    raise CheckFailed(
                        f"#admin-lenience-value did not show {target}: "
                        f"{page.inner_text('#admin-lenience-value')!r}, "
                        f"status {page.inner_text('#admin-status')!r}"
                    )
                restore_lenience = current
                admin_status = page.inner_text("#admin-status")
                if f"lenience {target:g}" not in admin_status:
                    raise CheckFailed(f"#admin-status does not report the new lenience: {admin_status!r}")
                status, after = api(base, "GET", "/admin/speculation", token=admin_token)
                if status != 200 or abs(float(after["lenience"]) - target) > 1e-9:
                    raise CheckFailed(
                        f"GET /admin/speculation after Apply: {status}, lenience "
                        f"{after.get('lenience') if isinstance(after, dict) else after!r}, wanted {target}"
                    )
                page.locator("#operator-panel").scroll_into_view_if_needed()
                page.screenshot(path=os.path.join(shot_dir, "operator.png"))
                ok(step, f"operator panel set lenience {current:g} -> {target:g}; the server reports "
                         f"{after['lenience']:g}; operator.png saved")

                # 7. no console errors, no page errors
                step = 7
                page.wait_for_timeout(500)
                if console_errors:
                    raise CheckFailed("console errors:\n  " + "\n  ".join(console_errors))
                ok(step, "no console errors or page errors")
            except Exception:
                if page is not None:
                    try:
                        page.screenshot(path=os.path.join(shot_dir, "failure.png"))
                    except Exception:
                        pass
                raise
            finally:
                browser.close()
    except CheckFailed as e:
        print(f"FAILED step {step}: {e}", file=sys.stderr)
        if console_errors:
            print("console errors seen:\n  " + "\n  ".join(console_errors), file=sys.stderr)
        return 1
    except Exception as e:  # a Playwright error, a lost server: still a clear failure
        print(f"FAILED step {step}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if restore_lenience is not None:
            api(base, "PUT", "/admin/speculation", {"lenience": restore_lenience}, admin_token)
    print("page check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
