"""The chat UI (Gradio), mounted in the API's process and fed by the same scheduler.

Method switch (the methods of `dart_jax.api.methods` the model has loaded), sliders for
temperature, top-p, top-k, answer length and draft tree size; every step's accepted chunk is
highlighted as it streams (alternating colours, the step's accepted length on hover), text from
plain decoding (method "ar", or a plain chunk of keep="auto") is not; live tokens/s (compilation
left out: "compiling…" while the server compiles for a new shape) and mean accepted length; Stop, Regenerate and
Clear; multi-turn history. "Side by side" sends each message through a second method too and
shows both answers, their speeds and the speedup. The second runs once the first is done: run
together, they would share the scheduler's rounds (one plain token per DART step), and the
speeds would compare the interleaving rather than the methods.
"""
from __future__ import annotations

import html
import logging
import math
import queue
import secrets
import threading
import time
from typing import Any

import gradio as gr
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection
from starlette.routing import Mount

from dart_jax.api import methods as decoding_methods
from dart_jax.api.text import StopText
from dart_jax.decoding.settings import GenerationSettings

from .protocol import APIError
from .scheduler import Job, Scheduler, thread_sink

log = logging.getLogger("dart_jax.serve")

CSS = """
.dj-c0 { background: #fde68a; border-radius: 3px; }
.dj-c1 { background: #bfdbfe; border-radius: 3px; }
.dark .dj-c0 { background: #854d0e; }
.dark .dj-c1 { background: #1e40af; }
.dj-msg { white-space: pre-wrap; overflow-wrap: anywhere; }
.dj-stats { font-variant-numeric: tabular-nums; }
"""
PLAIN_TIP = "plain decoding: no draft (tree size 0)"
# what the UI serves before the login (paths inside its mount): the page, which is the login form
# then, the form's post and the static files the form needs
PUBLIC_PATHS = ("/", "/login", "/login/", "/manifest.json", "/favicon.ico", "/robots.txt", "/theme.css",
                "/gradio_api/theme.css")
PUBLIC_FOLDERS = ("/assets/", "/static/", "/svelte/", "/pwa_icon")


def _number(value, name: str, whole: bool = False) -> float | int:
    """A number of the UI's settings as its client sent it (anyone may post any JSON there), or a
    ValueError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            whole and value != int(value)):
        raise ValueError(f"{name} must be a finite {'whole ' if whole else ''}number, got {value!r:.40}.")
    return int(value) if whole else float(value)


def _label(method: str) -> str:
    try:
        return decoding_methods.get(method).label
    except ValueError:
        return method


def _drafts(method: str) -> bool:
    try:
        return decoding_methods.get(method).drafts
    except ValueError:
        return False


def render(chunks: list[tuple], method: str) -> str:
    """An answer as HTML: each speculative step's text in a span (alternating colours), the step's
    accepted length on hover; text from plain decoding (chunks marked plain, or a method that does
    not draft) is not highlighted. The text is shown as it is (no Markdown): the chat panels keep
    its spaces and line breaks. `chunks`: (text, accepted length[, plain])."""
    if not _drafts(method):
        return html.escape("".join(chunk[0] for chunk in chunks))
    out, coloured = [], 0
    for i, (text, accepted, *plain) in enumerate(chunks):
        if not text:  # a step whose text is still held back (a partial character) shows in the next span
            continue
        if plain and plain[0]:
            out.append(f'<span class="dj-plain" title="{PLAIN_TIP}">{html.escape(text)}</span>')
            continue
        tip = "first token (prefill)" if accepted == 0 else f"step {i}: {accepted} accepted"
        out.append(f'<span class="dj-c{coloured % 2}" title="{tip}">{html.escape(text)}</span>')
        coloured += 1
    return "".join(out)


class _Run:
    """One answer being streamed: its job, its events, its text so far."""

    def __init__(self, scheduler: Scheduler, ids, settings, method: str, tree_size: int, decode):
        self.scheduler, self.method, self.chunks = scheduler, method, []
        self.stream = StopText(decode)
        self.events, sink = thread_sink()
        self.job: Job = scheduler.submit(ids, settings, sink, method=method, tree_size=tree_size)
        self.error: str | None = None
        # set on the job's last event, not from `job.done`: the scheduler marks the job done just
        # before it sends that event, which may still carry the last step's tokens
        self.finished = False

    def poll(self, timeout: float) -> None:
        if self.finished:
            return
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            piece = self.stream.feed(event.ids)
            if event.done:
                piece += self.stream.finish()
                self.error, self.finished = event.error, True
            if piece or event.accepted:
                self.chunks.append((piece, event.accepted, event.plain))
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    @property
    def text(self) -> str:
        return "".join(chunk[0] for chunk in self.chunks)

    def summary(self) -> str:
        """One line of figures: tokens/s (compilation left out, and "compiling…" instead while the
        server compiles for this answer), what the steps were, how the answer ended."""
        label, job = _label(self.method), self.job
        steps = job.stats.accept_lengths
        compiling = None if self.finished else getattr(self.scheduler, "compiling", lambda: None)()
        if compiling is not None:
            seconds, what = compiling
            line = (f"**{label}**: compiling… ({what} for this shape, {seconds:.0f} s; once per prompt length "
                    f"and batch shape: the speed shows when it is done) · {len(job.token_ids)} tokens so far")
        elif not _drafts(self.method):
            line = (f"**{label}**: {job.tokens_per_s:.1f} tokens/s · plain decoding, no draft · "
                    f"{len(job.token_ids)} tokens")
        else:
            tau = sum(steps) / len(steps) if steps else 0.0
            line = (f"**{label}**: {job.tokens_per_s:.1f} tokens/s · mean accepted length {tau:.2f} · "
                    f"{len(job.token_ids)} tokens in {len(steps)} steps")
            figures = job.stats.tree_figures()
            if figures.get("plain_tokens"):
                line += (f" ({figures['plain_tokens']} tokens by plain decoding where no tree paid off, not "
                         f"highlighted; mean accepted length of the drafted steps {figures['draft_tau']:.2f})")
        if compiling is None and job.compile_s >= 0.05:
            line += f" · {job.compile_s:.1f} s compiling not counted"
        if self.error:
            return line + f" · error: {html.escape(self.error)}"
        if self.finished and job.finish_reason == "cancelled":
            return line + " · stopped"
        if self.finished and job.finish_reason == "length":
            return line + " · reached the max new tokens"
        return line


class _Answering:
    """A session's answers in progress (one per method, one after the other), its Stop and Clear."""

    def __init__(self, runs: list[_Run]):
        self.runs, self.stopped, self.cleared = runs, False, False


class _Blocks(gr.Blocks):
    """Blocks whose events refuse a call with the wrong number of values in one log line and a
    message to the caller that names the values. Gradio's own check lets extra values through, and
    answers too few with a traceback in the log and its components' reprs."""

    def validate_inputs(self, block_fn, inputs):
        if len(inputs) != len(block_fn.inputs):
            # what Gradio's API lists (GET .../gradio_api/info): a conversation state is the server's, left out
            shown = [block for block in block_fn.inputs if not getattr(block, "skip_api", False)]
            names = ", ".join(getattr(block, "label", None) or block.get_block_name() for block in shown)
            takes = (f"{len(shown)} value{'s' * (len(shown) > 1)}, one per input in this order: {names}" if shown
                     else "no values")
            message = f"the UI's /{block_fn.api_name} takes {takes}; got {len(inputs)}."
            log.warning("the chat UI refused a request: %s", message)
            raise gr.Error(message, print_exception=False)
        super().validate_inputs(block_fn, inputs)


class ChatUI:
    def __init__(self, scheduler: Scheduler, title: str):
        self.scheduler, self.model, self.title = scheduler, scheduler.model, title
        self._running: dict[str, _Answering] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ handlers
    def _methods(self, method_a, side, method_b) -> list[str]:
        if not isinstance(side, bool):
            raise ValueError(f"side by side must be true or false, got {side!r:.40}.")
        methods = [method_a] + ([method_b] if side else [])
        for method in methods:
            if not isinstance(method, str) or method not in self.scheduler.methods:
                raise ValueError(f"unknown method {method!r:.40}; this server offers {sorted(self.scheduler.methods)}.")
        return methods

    def respond(self, message: str, turns: list[dict], method_a: str, side: bool, method_b: str, temperature: float,
                top_p: float, top_k: float, max_new: float, tree_size: Any, request: gr.Request):
        """The handler of Send: its values come as the client sent them (no Gradio preprocessing,
        whose refusals print tracebacks), checked here; a refused one is shown to the user and
        logged in one line."""
        try:
            if message is not None and not isinstance(message, str):
                raise ValueError(f"the message must be text, got {type(message).__name__}.")
            message = (message or "").strip()
            if not message:
                yield self._view(turns, "", "Type a message first.")
                return
            methods = self._methods(method_a, side, method_b)
            size = None if tree_size is None else _number(tree_size, "the draft tree size", whole=True)
            settings = GenerationSettings(max_new_tokens=_number(max_new, "max new tokens", whole=True),
                                          max_length=self.scheduler.max_length,
                                          temperature=_number(temperature, "the temperature"),
                                          top_p=_number(top_p, "top-p"), top_k=_number(top_k, "top-k", whole=True),
                                          seed=int(time.time_ns() % 2**31))
            prompts = []  # every method's prompt is checked now; the second is submitted later
            for i, method in enumerate(methods):
                prompts.append(self.model.encode(self._messages(turns, message, "ab"[i])))
                self.scheduler.check(prompts[-1], settings, method, size)

            def start(i: int) -> _Run:
                return _Run(self.scheduler, prompts[i], settings, methods[i], size, self.model.decode)
            answering = _Answering([start(0)])
        except (ValueError, RuntimeError) as e:
            log.warning("the chat UI refused a request: %s", e)
            yield self._view(turns, message if isinstance(message, str) else "", f"error: {html.escape(str(e))}")
            return
        runs = answering.runs
        key = request.session_hash if request is not None else "-"
        with self._lock:
            previous, self._running[key] = self._running.get(key), answering
        if previous is not None:  # a new message or Regenerate while an answer streams: that one stops
            self._stop(previous)
        turn = {"user": message, "methods": methods, "a": "", "b": "", "html_a": "", "html_b": ""}
        turns = turns + [turn]
        try:
            last, box, error = 0.0, "", None  # the textbox is emptied once: what the user types meanwhile stays
            while True:
                runs[-1].poll(0.02)
                if answering.cleared:  # Clear was pressed: have the last word, an empty conversation
                    yield self._view([], "", "")
                    return
                if runs[-1].finished and len(runs) < len(methods) and not answering.stopped:
                    try:
                        runs.append(start(len(runs)))
                    except (ValueError, RuntimeError) as e:
                        answering.stopped, error = True, str(e)
                for i, run in enumerate(runs):
                    turn["ab"[i]], turn["html_" + "ab"[i]] = run.text, render(run.chunks, run.method)
                finished = runs[-1].finished and (len(runs) == len(methods) or answering.stopped)
                if finished:  # a method that never ran (stopped first): its panel goes on with the first one's answer
                    turn["methods"] = methods[:len(runs)]
                if finished or time.perf_counter() - last > 0.05:
                    last = time.perf_counter()
                    yield self._view(turns, box, self._stats(runs, methods, answering.stopped, error))
                    box = gr.skip()
                if finished:
                    return
        finally:
            self._stop(answering)
            with self._lock:
                if self._running.get(key) is answering:
                    del self._running[key]

    def _stop(self, answering: _Answering) -> None:
        answering.stopped = True
        for run in list(answering.runs):
            self.scheduler.cancel(run.job)

    def stop(self, request: gr.Request):
        key = request.session_hash if request is not None else "-"
        with self._lock:
            answering = self._running.get(key)
        if answering is not None:
            self._stop(answering)

    def regenerate(self, turns: list[dict], method_a: str, side: bool, method_b: str, temperature: float,
                   top_p: float, top_k: float, max_new: float, tree_size: Any, request: gr.Request):
        if not turns:
            yield self._view(turns, "", "Nothing to regenerate yet.")
            return
        yield from self.respond(turns[-1]["user"], turns[:-1], method_a, side, method_b, temperature, top_p, top_k,
                                max_new, tree_size, request)

    def clear(self, request: gr.Request):
        """An empty conversation; an answer that still streams stops first."""
        key = request.session_hash if request is not None else None
        with self._lock:
            answering = self._running.get(key) if key is not None else None
        if answering is not None:
            answering.cleared = True
            self._stop(answering)
        return self._view([], "", "")

    # ------------------------------------------------------------------ views
    @staticmethod
    def _side(turn: dict, side: str) -> str:
        """Which answer of `turn` the conversation of panel `side` goes on with: its own, or the
        main one for a turn answered before "Side by side" was on."""
        return side if len(turn["methods"]) > "ab".index(side) else "a"

    def _messages(self, turns: list[dict], message: str, side: str) -> list[dict]:
        system = self.model.chat_settings.system_prompt
        messages = [{"role": "system", "content": system}] if system else []
        for turn in turns:
            messages += [{"role": "user", "content": turn["user"]},
                         {"role": "assistant", "content": turn[self._side(turn, side)]}]
        return messages + [{"role": "user", "content": message}]

    @classmethod
    def _chat(cls, turns: list[dict], side: str) -> list[dict]:
        out = []
        for turn in turns:
            answer = turn["html_" + cls._side(turn, side)]
            out.append({"role": "user", "content": f'<div class="dj-msg">{html.escape(turn["user"])}</div>'})
            out.append({"role": "assistant", "content": f'<div class="dj-msg">{answer}</div>'})
        return out

    def _view(self, turns, box: str, stats: str):
        return turns, self._chat(turns, "a"), self._chat(turns, "b"), box, stats

    @staticmethod
    def _stats(runs: list[_Run], methods: list[str], stopped: bool = False, error: str | None = None) -> str:
        lines = [run.summary() for run in runs]
        for method in methods[len(runs):]:  # side by side: the second method, not started yet
            if error:
                state = f"error: {html.escape(error)}"
            elif stopped:
                state = "not run (stopped)"
            else:
                state = f"waits for {_label(methods[0])}"
            lines.append(f"**{_label(method)}**: {state}")
        if len(runs) == 2 and runs[1].job.tokens_per_s > 0:
            lines.append(f"**speedup** {_label(runs[0].method)} / {_label(runs[1].method)}: "
                         f"{runs[0].job.tokens_per_s / runs[1].job.tokens_per_s:.2f}x")
        return "  \n".join(lines)

    # ------------------------------------------------------------------ layout
    def blocks(self, page_title: str | None = None) -> gr.Blocks:
        """The UI; `page_title` (default: the title) names the browser tab and the app's manifest."""
        methods = [(label, name) for name, label in self.scheduler.methods.items()]
        sizes = list(self.scheduler.tree_sizes)
        with _Blocks(title=page_title or self.title, analytics_enabled=False) as demo:
            gr.Markdown(f"## {html.escape(self.title)}\nDART speculative decoding: each highlighted chunk is one "
                        "step's accepted draft (hover for its length); text that is not highlighted came from "
                        "plain decoding, one token per target call with no draft (the Plain method, or where "
                        "the adaptive tree size found that no tree pays). The API is at `/v1` (OpenAI-compatible).")
            turns = gr.State([])
            with gr.Row():
                method_a = gr.Radio(methods, value="dart", label="Method", elem_id="dj-method")
                side = gr.Checkbox(False, label="Side by side", elem_id="dj-side")
                method_b = gr.Radio(methods, value=decoding_methods.baseline().name, label="Compare with", elem_id="dj-method-b")
            # messages are our own HTML (escaped text in highlight spans), shown as they are: no
            # Markdown or LaTeX, which would mangle text cut into spans; no copy/share buttons,
            # which would copy that HTML rather than the text
            chat = dict(height=420, feedback_options=None, render_markdown=False, latex_delimiters=[], buttons=[])
            with gr.Row():
                chat_a = gr.Chatbot(label="Answer", elem_id="dj-chat-a", **chat)
                chat_b = gr.Chatbot(label="Side by side", elem_id="dj-chat-b", visible=False, **chat)
            stats = gr.Markdown("", elem_id="dj-stats", elem_classes="dj-stats")
            box = gr.Textbox(placeholder="Message (Enter to send)", label="Message", show_label=False, elem_id="dj-input",
                             lines=1)
            with gr.Row():
                send = gr.Button("Send", variant="primary", elem_id="dj-send")
                stop = gr.Button("Stop", elem_id="dj-stop")
                again = gr.Button("Regenerate", elem_id="dj-regenerate")
                clear = gr.Button("Clear", elem_id="dj-clear")
            with gr.Accordion("Settings", open=False):
                temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)",
                                        elem_id="dj-temperature")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p", elem_id="dj-top-p")
                top_k = gr.Slider(0, 100, value=0, step=1, label="Top-k (0 = off)", elem_id="dj-top-k")
                # at least 8..16: Gradio refuses a slider whose minimum is its maximum (--max-length 16)
                max_new = gr.Slider(8, max(self.scheduler.max_length // 2, 16), value=min(256, self.scheduler.max_length // 2),
                                    step=8, label="Max new tokens", elem_id="dj-max-new")
                tree = gr.Dropdown(sizes, value=self.scheduler.default_tree_size, label="Draft tree size (DART)",
                                   elem_id="dj-tree-size")
            settings = [method_a, side, method_b, temperature, top_p, top_k, max_new, tree]
            outputs = [turns, chat_a, chat_b, box, stats]
            side.change(lambda on: gr.update(visible=on), side, chat_b)
            send.click(self.respond, [box, turns, *settings], outputs, preprocess=False)
            box.submit(self.respond, [box, turns, *settings], outputs, preprocess=False)
            again.click(self.regenerate, [turns, *settings], outputs, preprocess=False)
            stop.click(self.stop, None, None)  # the answer ends as "stopped", its text so far kept
            # Clear, or a panel's own trash button (which would otherwise empty that panel alone)
            for clearing in (clear.click, chat_a.clear, chat_b.clear):
                clearing(self.clear, None, outputs)
        return demo


class LoginRequired:
    """ASGI wrapper of the mounted Gradio app: every route but the login form and the static files
    (PUBLIC_PATHS, PUBLIC_FOLDERS) needs the login, a token Gradio handed out in its cookie. Gradio
    itself guards only some of its routes (its heartbeat, for one, streams to anyone)."""

    def __init__(self, gradio_app):
        self.app = gradio_app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self._public(scope) or self._logged_in(scope):
            return await self.app(scope, receive, send)
        error = APIError(401, "log in first: open the UI's page and log in with any user name and the server's API "
                              "key as the password.", code="login_required")
        await JSONResponse(error.body(), status_code=401)(scope, receive, send)

    @staticmethod
    def _public(scope) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        return path in PUBLIC_PATHS or path.startswith(PUBLIC_FOLDERS)

    def _logged_in(self, scope) -> bool:
        cookies = HTTPConnection(scope).cookies
        tokens = [cookies.get(f"access-token{kind}-{self.app.cookie_id}") for kind in ("", "-unsecure")]
        return any(token is not None and token in self.app.tokens for token in tokens)


def mount(app, scheduler: Scheduler, *, title: str, path: str = "/ui", api_key: str | None = None):
    """Mount the chat UI on `app` (a FastAPI app) at `path`. With `api_key`, the UI and its Gradio
    endpoints need a login first (`LoginRequired`): any user name, the key as the password; what
    Gradio shows before the login (the page title, manifest.json) is then named "dart_jax" alone,
    not after the model."""
    ui = ChatUI(scheduler, title)
    demo = ui.blocks(page_title=title if api_key is None else "dart_jax")
    demo.queue(default_concurrency_limit=max(scheduler.slots, 1) * 2)
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    app.state.ui_path = path
    login = {}
    if api_key is not None:
        login = dict(auth=lambda _user, password: secrets.compare_digest(str(password).encode(), api_key.encode()),
                     auth_message="This server needs its API key: any user name, the key as the password.")
    app = gr.mount_gradio_app(app, demo, path=path, css=CSS, theme=theme, footer_links=[], **login)
    if api_key is not None:
        mounted = next(r for r in app.routes if isinstance(r, Mount) and r.path == path)
        mounted.app = LoginRequired(mounted.app)
    return app
