package rollout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/stages/rollout/adapter"
	"github.com/kilnrl/kiln/stages/rollout/engine"
	"github.com/kilnrl/kiln/stages/stage"
)

// recordVersion is the code version of recorded turns (dataset.Identity).
const recordVersion = "1"

func adapterCommand(env *stage.Env) *cli.Command {
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

Example:
   kiln-rollout adapter --engine http://127.0.0.1:8000 --listen 127.0.0.1:8001 \
       --tokenizer-dir /models/qwen3 --out recordings/claude-1`,
		Flags: []cli.Flag{
			stage.StoreFlag(),
			&cli.StringFlag{Name: "engine", Required: true, Usage: "engine base URL (vLLM OpenAI-compatible server)"},
			&cli.StringFlag{Name: "engine-api-key", EnvVars: []string{"KILN_ENGINE_API_KEY"}, Usage: "bearer token for an engine started with --api-key"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8001", Usage: "address to serve the adapter on"},
			&cli.StringFlag{Name: "out", Required: true, Usage: "dataset name prefix: NAME/turns and NAME/trajectories"},
			&cli.StringFlag{Name: "tokenizer-dir", Usage: "served checkpoint directory with tokenizer JSON files"},
			&cli.StringFlag{Name: "mode", Value: "auto", Usage: "engine route: auto, generate, or completions (fallback)"},
			&cli.StringFlag{Name: "reasoning-parser", Value: "qwen3", Usage: `"qwen3" or "" (none)`},
			&cli.StringFlag{Name: "tool-parser", Value: "qwen3_coder", Usage: `"qwen3_coder", "hermes" or "" (XML fallback only)`},
			&cli.IntFlag{Name: "max-turn-tokens", Usage: "cap on max_tokens per turn (0: none)"},
			&cli.IntFlag{Name: "fork-merge-max-response-tokens", Usage: "trajectory assembly threshold T (see kiln-rollout assemble)"},
		},
		Action: func(c *cli.Context) error { return runAdapter(c, env) },
	}
}

func runAdapter(c *cli.Context, env *stage.Env) error {
	if c.NArg() != 0 {
		return stage.Usagef("adapter: takes no arguments")
	}
	mode, err := engine.ParseMode(c.String("mode"))
	if err != nil {
		return stage.UsageError{Err: err}
	}
	st, err := stage.OpenStore(c)
	if err != nil {
		return err
	}
	out := c.String("out")
	if err := dataset.CheckName(out); err != nil {
		return stage.UsageError{Err: err}
	}
	eng, err := engine.New(engine.Options{BaseURL: c.String("engine"), Mode: mode, APIKey: c.String("engine-api-key")})
	if err != nil {
		return stage.UsageError{Err: err}
	}
	ctx := c.Context
	caps, err := eng.Probe(ctx)
	if err != nil {
		return fmt.Errorf("adapter: engine %s: %w", c.String("engine"), err)
	}
	var special engine.SpecialTokens
	if dir := c.String("tokenizer-dir"); dir != "" {
		if special, err = engine.LoadSpecialTokens(dir); err != nil {
			return err
		}
	} else {
		env.Log.Warn("no --tokenizer-dir: prefix reuse cannot check special tokens; histories may be re-rendered")
	}
	srv := adapter.New(adapter.Options{Engine: eng, Special: special, MaxTurnTokens: c.Int("max-turn-tokens"),
		ReasoningParser: c.String("reasoning-parser"), ToolParser: c.String("tool-parser")})
	ln, err := net.Listen("tcp", c.String("listen"))
	if err != nil {
		return stage.UsageError{Err: fmt.Errorf("adapter: --listen %q: %w", c.String("listen"), err)}
	}
	env.Log.Info("adapter listening", "addr", ln.Addr().String(), "engine", c.String("engine"),
		"route", string(caps.Route), "context", caps.ContextLength)
	rec := recording{st: st, env: env, out: out, threshold: c.Int("fork-merge-max-response-tokens")}
	return serveAndRecord(ctx, ln, srv, rec)
}

// recording is where an adapter run commits its sessions.
type recording struct {
	st        store.Store
	env       *stage.Env
	out       string
	threshold int
}

// serveAndRecord serves until ctx is cancelled, then finishes every session
// and commits the turns and their trajectories.
func serveAndRecord(ctx context.Context, ln net.Listener, srv *adapter.Server, rec recording) error {
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second}
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
		return stage.BadInputError{Err: errors.New("adapter: no session made a turn; nothing recorded")}
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
	res, err := stage.Write(ctx, r.st, stage.Output{Name: r.out + "/turns", Kind: records.TurnsKind, Identity: id},
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
	_, err = writeTrajectories(ctx, r.env, r.st, stage.Output{Name: r.out + "/trajectories", Kind: records.TrajectoriesKind, Identity: tid},
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
