package rollout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/parse"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// recordVersion is the code version of recorded turns (dataset.Identity).
const recordVersion = "1"

func adapterCommand(env *stagecmd.Env) *cli.Command {
	f := &adapterCLI{}
	// Unset sampling defaults are the engine's: these three are read only
	// when given (c.IsSet of the flag's own name; the flag's IsSet sees only
	// its environment variable).
	f.temperature = &cli.Float64Flag{Name: "temperature", Usage: "default sampling temperature, [0, 2]", DefaultText: "unset: the engine's, 1.0"}
	f.topP = &cli.Float64Flag{Name: "top-p", Usage: "default nucleus top_p, (0, 1]", DefaultText: "unset: 1"}
	f.topK = &cli.IntFlag{Name: "top-k", Usage: "default top_k, -1 or 0 for off", DefaultText: "unset: off"}
	return &cli.Command{
		Name:  "adapter",
		Usage: "serve the model adapter on its own and record every client session",
		Description: `Serves Anthropic Messages (/v1/messages), OpenAI Responses (/v1/responses)
and Chat Completions (/v1/chat/completions) over a vLLM-compatible engine,
token-in/token-out: prompts are rendered with the engine's own chat template
(/tokenize), generated from token ids, and every turn's exact prompt ids,
output ids and logprobs are recorded. Point any coding CLI at --listen with a
session id as its API key (each distinct key is one session).

On SIGINT or SIGTERM the adapter stops accepting requests, finishes the open
sessions, and commits them as a turns dataset (--out NAME/turns) and their
training segments (--out NAME/trajectories, as kiln-rollout assemble would
build them); the trajectories reference is the last line of stdout. Sessions
are numbered (rollout_id, index, group_index) in the order they first called.

The engine must serve the token-in generate route (vLLM --enable-scale-out on
recent releases) unless --mode completions; the startup probe says which flag
is missing. --tokenizer-dir is the served checkpoint's directory (JSON
tokenizer files only), for the special token ids prefix reuse needs. An
http:// engine is reached directly over kept-alive connections (HTTP_PROXY
is not consulted); a server started with --api-key needs --engine-api-key.

Long generations: a streamed turn is generated whole before its reply is
sent, and clients give up on a silent model call — Claude Code after
API_TIMEOUT_MS (600 s by default) without a response head, then it asks
again from scratch; Codex after stream_idle_timeout_ms (300 s) without an
event once it has the head. A streamed turn still unanswered after
--keepalive is answered at once with the stream's head and keep-alives
(Anthropic's ping event; an SSE comment on Chat Completions; on Responses
the reply's response.created, then response.in_progress events) until the
reply follows in the same stream; a turn failing after that ends the
stream with the protocol's error event.

Connections: served by net/http, HTTP/1.1 without TLS; a request's head must
arrive within 30 s and hold at most 1 MiB, a body at most 64 MiB; a
kept-alive connection may idle 5 minutes between requests; each write of a
reply must complete within a minute (a turn itself, and the silence between
its keep-alives, may last as long as the generation).

CPU: most of a turn's CPU is its five HTTP exchanges (the client's and four
engine calls) and the garbage collector. On a host with memory to spare,
GOGC=400 in the environment cuts the collector's share from ~20 µs a turn
to ~5 µs (BENCHMARKS.md), for a heap up to five times the live data
instead of twice.

Example:
   kiln-rollout adapter --engine http://127.0.0.1:8000 --listen 127.0.0.1:8001 \
       --tokenizer-dir /models/qwen3 --out recordings/claude-1`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "engine", Required: true, Destination: &f.engine, Usage: "engine base URL (vLLM OpenAI-compatible server)"},
			&cli.StringFlag{Name: "engine-api-key", EnvVars: []string{"KILN_ENGINE_API_KEY"}, Destination: &f.engineAPIKey, Usage: "bearer token for an engine started with --api-key"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8001", Destination: &f.listen, Usage: "address to serve the adapter on"},
			&cli.StringFlag{Name: "out", Required: true, Destination: &f.out, Usage: "dataset name prefix: NAME/turns and NAME/trajectories"},
			&cli.StringFlag{Name: "tokenizer-dir", Destination: &f.tokenizerDir, Usage: "served checkpoint directory with tokenizer JSON files"},
			&cli.StringFlag{Name: "mode", Value: "auto", Destination: &f.mode, Usage: "engine route: auto, generate, or completions (fallback)"},
			&cli.StringFlag{Name: "reasoning-parser", Value: "qwen3", Destination: &f.reasoningParser, Usage: `"qwen3" or "" (none)`},
			&cli.StringFlag{Name: "tool-parser", Value: "qwen3_coder", Destination: &f.toolParser, Usage: `"qwen3_coder", "hermes" or "" (XML fallback only)`},
			&cli.IntFlag{Name: "max-turn-tokens", Destination: &f.maxTurnTokens, Usage: "cap on max_tokens per turn (0: none)"},
			&cli.IntFlag{Name: "max-tokens", Destination: &f.maxTokens, Usage: "max_tokens of a turn, which a client's own max_tokens can only lower (spec §1.4)", DefaultText: "4096"},
			f.temperature, f.topP, f.topK,
			&cli.StringFlag{Name: "chat-template-kwargs", Destination: &f.chatTemplateKwargs, Usage: `JSON object passed to the chat template, e.g. '{"enable_thinking": true}'`},
			&cli.IntFlag{Name: "max-turns-per-session", Destination: &f.maxTurnsPerSession, Usage: "answer 429 once a session has asked this many turns (0: unlimited)"},
			&cli.IntFlag{Name: "fork-merge-max-response-tokens", Destination: &f.threshold, Usage: "trajectory assembly threshold T (see kiln-rollout assemble)"},
			&cli.DurationFlag{Name: "keepalive", Value: adapter.DefaultKeepAlive, Destination: &f.keepAlive, Usage: "a streamed turn unanswered this long gets its stream's head and a keep-alive this often until the reply (Anthropic ping events, Chat Completions comments, Responses in_progress events; 0: never)"},
		},
		Action: func(c *cli.Context) error { return runAdapter(c, env, f) },
	}
}

// adapterCLI is what the adapter's flags set.
type adapterCLI struct {
	engine, engineAPIKey, listen, out, tokenizerDir, mode   string
	reasoningParser, toolParser, chatTemplateKwargs         string
	maxTurnTokens, maxTokens, maxTurnsPerSession, threshold int
	keepAlive                                               time.Duration
	temperature, topP                                       *cli.Float64Flag
	topK                                                    *cli.IntFlag
}

func runAdapter(c *cli.Context, env *stagecmd.Env, f *adapterCLI) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("adapter: takes no arguments")
	}
	mode, err := engine.ParseMode(f.mode)
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	out := f.out
	if err := dataset.CheckName(out); err != nil {
		return stagecmd.UsageError{Err: err}
	}
	opts, err := adapterOptions(adapterFlags{
		maxTurnTokens: f.maxTurnTokens, maxTokens: f.maxTokens,
		temperature: optional(c.IsSet(f.temperature.Name), f.temperature.Get(c)), topP: optional(c.IsSet(f.topP.Name), f.topP.Get(c)),
		topK:               optional(c.IsSet(f.topK.Name), f.topK.Get(c)),
		chatTemplateKwargs: f.chatTemplateKwargs, maxTurnsPerSession: f.maxTurnsPerSession,
		reasoningParser: f.reasoningParser, toolParser: f.toolParser,
		keepAlive: f.keepAlive,
	})
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	eng, err := engine.New(engine.Options{BaseURL: f.engine, Mode: mode, APIKey: f.engineAPIKey})
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	ctx := c.Context
	caps, err := eng.Probe(ctx)
	if err != nil {
		return fmt.Errorf("adapter: engine %s: %w", f.engine, err)
	}
	var special engine.SpecialTokens
	if dir := f.tokenizerDir; dir != "" {
		if special, err = engine.LoadSpecialTokens(dir); err != nil {
			return err
		}
	} else {
		env.Log.Warn("no --tokenizer-dir: prefix reuse cannot check special tokens; histories may be re-rendered")
	}
	opts.Engine, opts.Special = eng, special
	srv := adapter.New(opts)
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return stagecmd.UsageError{Err: fmt.Errorf("adapter: --listen %q: %w", f.listen, err)}
	}
	env.Log.Info("adapter listening", "addr", ln.Addr().String(), "engine", f.engine,
		"route", string(caps.Route), "context", caps.ContextLength)
	rec := recording{st: st, env: env, out: out, threshold: f.threshold}
	return serveAndRecord(ctx, ln, srv, rec)
}

// adapterFlags are the adapter's settings as given on the command line.
type adapterFlags struct {
	maxTurnTokens, maxTokens, maxTurnsPerSession int
	temperature, topP                            *float64
	topK                                         *int
	chatTemplateKwargs                           string
	reasoningParser, toolParser                  string
	keepAlive                                    time.Duration
}

// optional is v when its flag was given, else nil.
func optional[T any](set bool, v T) *T {
	if !set {
		return nil
	}
	return &v
}

// adapterOptions checks the flags and turns them into adapter.Options
// (without the engine). Every error names the flag and what it wants.
func adapterOptions(f adapterFlags) (adapter.Options, error) {
	var o adapter.Options
	if f.maxTurnTokens < 0 {
		return o, fmt.Errorf("--max-turn-tokens %d: want 0 (no cap) or more", f.maxTurnTokens)
	}
	if f.maxTokens < 0 {
		return o, fmt.Errorf("--max-tokens %d: want 0 (the default) or more", f.maxTokens)
	}
	if f.maxTurnsPerSession < 0 {
		return o, fmt.Errorf("--max-turns-per-session %d: want 0 (unlimited) or more", f.maxTurnsPerSession)
	}
	if t := f.temperature; t != nil && (*t < 0 || *t > 2 || math.IsNaN(*t)) {
		return o, fmt.Errorf("--temperature %v: want a value in [0, 2]", *t)
	}
	if p := f.topP; p != nil && (*p <= 0 || *p > 1 || math.IsNaN(*p)) {
		return o, fmt.Errorf("--top-p %v: want a value in (0, 1]", *p)
	}
	if k := f.topK; k != nil && *k < -1 {
		return o, fmt.Errorf("--top-k %d: want -1 or 0 (off) or a positive count", *k)
	}
	switch f.reasoningParser {
	case "", "qwen3":
	default:
		return o, fmt.Errorf("--reasoning-parser %q: want qwen3 or an empty string (none)", f.reasoningParser)
	}
	if _, ok := parse.ParseFormat(f.toolParser); !ok {
		return o, fmt.Errorf("--tool-parser %q: want qwen3_coder, hermes or an empty string (XML fallback only)", f.toolParser)
	}
	if kw := strings.TrimSpace(f.chatTemplateKwargs); kw != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(kw), &m); err != nil || m == nil {
			return o, fmt.Errorf("--chat-template-kwargs %q: want a JSON object, e.g. '{\"enable_thinking\": true}'", f.chatTemplateKwargs)
		}
		o.ChatTemplateKwargs = json.RawMessage(kw)
	}
	switch {
	case f.keepAlive < 0:
		return o, fmt.Errorf("--keepalive %s: want a positive interval, or 0 for none", f.keepAlive)
	case f.keepAlive == 0:
		o.KeepAlive = -1
	default:
		o.KeepAlive = f.keepAlive
	}
	o.MaxTurnTokens, o.MaxTurnsPerSession = f.maxTurnTokens, f.maxTurnsPerSession
	o.Sampling = engine.SamplingParams{MaxTokens: f.maxTokens, Temperature: f.temperature, TopP: f.topP, TopK: f.topK}
	o.ReasoningParser, o.ToolParser = f.reasoningParser, f.toolParser
	return o, nil
}

// recording is where an adapter run commits its sessions.
type recording struct {
	st        store.Store
	env       *stagecmd.Env
	out       string
	threshold int
}

// serveAndRecord serves until ctx is cancelled, then finishes every session
// and commits the turns and their trajectories.
func serveAndRecord(ctx context.Context, ln net.Listener, srv *adapter.Server, rec recording) error {
	hs := adapter.NewHTTPServer(srv, adapter.HTTPLimits{}, slog.NewLogLogger(rec.env.Log.Handler(), slog.LevelWarn))
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("adapter: serving: %w", err)
	case <-ctx.Done():
	}
	rec.env.Log.Info("stopping: finishing open sessions")
	// Refuse new requests and let running turns end (for at most 30 s;
	// Finish cancels what is still running after that).
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		rec.env.Log.Warn("turns still running at shutdown are cancelled", "err", err)
	}
	var turns []records.Turn
	for i, id := range srv.Sessions() {
		ts, err := srv.Finish(id)
		if err != nil {
			return fmt.Errorf("adapter: finishing session %q: %w", id, err)
		}
		for j := range ts {
			ts[j].RolloutID, ts[j].Index, ts[j].GroupIndex = int64(i), int64(i), int64(i)
		}
		turns = append(turns, ts...)
	}
	if len(turns) == 0 {
		return stagecmd.BadInputError{Err: errors.New("adapter: no session made a turn; nothing recorded")}
	}
	return rec.commit(shutdownCtx, turns)
}

// commit writes the turns version, then assembles it into trajectories.
func (r recording) commit(ctx context.Context, turns []records.Turn) error {
	var nonce [8]byte
	rand.Read(nonce[:])
	// A recording is unique: its id covers when and which run made it.
	id := dataset.Identity{Stage: "rollout-adapter", CodeVersion: recordVersion,
		Args: map[string]any{"recording": time.Now().UTC().Format(time.RFC3339) + "-" + hex.EncodeToString(nonce[:])}}
	res, err := stagecmd.Write(ctx, r.st, stagecmd.Output{Name: r.out + "/turns", Kind: records.TurnsKind(), Identity: id},
		r.env.Stdout, r.env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
			_, err := w.WriteShard(ctx, int64(len(turns)), nil, func(out io.Writer) error {
				enc, err := records.NewTurnEncoder(out, records.ArrowOptions{})
				if err != nil {
					return err
				}
				if err := enc.Write(turns...); err != nil {
					return err
				}
				return enc.Close()
			})
			return map[string]any{"turns": len(turns)}, err
		})
	if err != nil {
		return err
	}
	tid := dataset.Identity{Stage: "rollout-assemble", CodeVersion: assembleVersion,
		Args:   map[string]any{"fork_merge_max_response_tokens": r.threshold, "uncompressed": false},
		Inputs: []dataset.Ref{res.Ref}}
	_, err = writeTrajectories(ctx, r.env, r.st, stagecmd.Output{Name: r.out + "/trajectories", Kind: records.TrajectoriesKind(), Identity: tid},
		r.threshold, records.ArrowOptions{}, func(add func(records.Turn) error) error {
			for _, t := range turns {
				if err := add(t); err != nil {
					return err
				}
			}
			return nil
		})
	return err
}
