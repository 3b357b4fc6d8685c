package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unsafe"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/assembly"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// assembleVersion is the code version of assemble (dataset.Identity):
// bump it whenever the same turns would assemble differently.
const assembleVersion = "1"

// shardTokens bounds the tokens of one trajectories shard.
const shardTokens = 16 << 20

// Commands returns the kiln-rollout commands.
func Commands(env *stagecmd.Env) []*cli.Command {
	return []*cli.Command{assembleCommand(env), adapterCommand(env), runCommand(env), checkCommand(env)}
}

func assembleCommand(env *stagecmd.Env) *cli.Command {
	f := &assembleFlags{}
	return &cli.Command{
		Name:  "assemble",
		Usage: "rebuild training segments from saved turn records, offline",
		Description: `Turns every session's turn records into training segments (a trajectories
version) exactly as a live rollout does, with no engine, adapter or sandbox:
the routing tree of the session's messages, then linearization into segments
whose trained tokens (loss_mask 1) are the tokens the policy sampled, with their
sampler logprobs; context tokens have loss_mask 0. A generated turn shared by
sibling branches is trained once. See internal/agent/assembly for the contract.

Input: --turns REF (a turns dataset), or --turns-jsonl FILE (local or s3://):
one JSON object per turn with the turns fields — session, group_index, index,
prompt_ids, output_ids, output_log_probs, finish_reason, prompt_messages,
response_message, max_context_tokens, optional rollout_id (default index),
turn (default: position within the session), reward, replay columns. Turns of
a session must be contiguous; memory holds one session at a time.

--fork-merge-max-response-tokens T (default 0): a later prompt that no longer
token-matches an earlier sampled output starts a new segment, so no sampled
output is lost. With T > 0, a drift inside the most recent response whose new
output is shorter than T re-aligns it as context instead (and a short
rewritten assistant message is merged), trading discarded signal for fewer
segments (the reference's VIME_FORK_MERGE_MAX_RESPONSE_TOKENS).

Segments of a session are truncated to its max_context_tokens (0 = off).
reward stays null unless the turns carry one: grades are the source of truth.
With --shard i/n sessions are dealt to parts by a hash of their id; every
split yields the same segments.

Example:
   kiln-rollout assemble --turns turns/step-3 --out trajectories/step-3`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "turns", Destination: &f.turns, Usage: "turns dataset to assemble (name or name@version)"},
			&cli.StringFlag{Name: "turns-jsonl", Destination: &f.turnsJSONL, Usage: "turn records as JSON lines (file or s3://bucket/key; .zst ok)"},
			&cli.StringFlag{Name: "out", Value: "trajectories", Destination: &f.out, Usage: "dataset name to write"},
			&cli.IntFlag{Name: "fork-merge-max-response-tokens", Destination: &f.threshold, Usage: "threshold T (see above)"},
			&cli.BoolFlag{Name: "uncompressed", Destination: &f.uncompressed, Usage: "write plain Arrow buffers (mmap-able) instead of zstd"},
			stagecmd.ShardFlag(),
			stagecmd.PrintVersionFlag(&f.printVersion),
		},
		Action: func(c *cli.Context) error { return assemble(c, env, f) },
	}
}

// assembleFlags are what assemble's flags set.
type assembleFlags struct {
	turns, turnsJSONL, out     string
	threshold                  int
	uncompressed, printVersion bool
}

func assemble(c *cli.Context, env *stagecmd.Env, f *assembleFlags) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("assemble: takes no arguments (did you mean --turns-jsonl %s?)", c.Args().First())
	}
	ref, jsonl := f.turns, f.turnsJSONL
	if (ref == "") == (jsonl == "") {
		return stagecmd.Usagef("assemble: give exactly one of --turns REF and --turns-jsonl FILE")
	}
	threshold := f.threshold
	if threshold < 0 {
		return stagecmd.Usagef("assemble: --fork-merge-max-response-tokens must be >= 0, got %d", threshold)
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	part, err := stagecmd.PartFrom(c)
	if err != nil {
		return err
	}
	ctx := c.Context
	id := dataset.Identity{Stage: "rollout-assemble", CodeVersion: assembleVersion,
		Args: map[string]any{"fork_merge_max_response_tokens": threshold, "uncompressed": f.uncompressed}}
	var read func(add func(records.Turn) error) error
	if ref != "" {
		inputs, err := stagecmd.ResolveInputs(ctx, st, []string{ref}, part)
		if err != nil {
			return err
		}
		id.Inputs = inputs
		read = func(add func(records.Turn) error) error {
			v, err := dataset.OpenKind(ctx, st, inputs[0], records.TurnsKind(), "--turns")
			if err != nil {
				return err
			}
			return readTurnsDataset(ctx, v, add)
		}
	} else {
		src, err := stagecmd.ParseInput(jsonl)
		if err != nil {
			return stagecmd.UsageError{Err: err}
		}
		ext, err := src.Identify(ctx, "turns")
		if err != nil {
			return err
		}
		id.External = []dataset.External{ext}
		read = func(add func(records.Turn) error) error {
			rc, err := src.Open(ctx)
			if err != nil {
				return err
			}
			defer rc.Close()
			return readTurnsJSONL(rc, jsonl, add)
		}
	}
	out := stagecmd.Output{Name: f.out, Kind: records.TrajectoriesKind(), Identity: id, Part: part,
		PrintVersion: f.printVersion, Hook: env.Hook}
	_, err = writeTrajectories(ctx, env, st, out, threshold, records.ArrowOptions{Uncompressed: f.uncompressed}, read)
	return err
}

// writeTrajectories assembles the sessions read delivers (turns grouped by
// session) and writes them as the trajectories version out describes.
func writeTrajectories(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, threshold int,
	arrow records.ArrowOptions, read func(add func(records.Turn) error) error) (dataset.Result, error) {
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		a := &assembler{w: w, part: out.Part, opts: assembly.Options{ForkMergeMaxResponseTokens: threshold},
			arrow: arrow, prog: stagecmd.NewProgress(env.Stderr, env.Log, "assemble", "sessions", -1)}
		sessions := newSessionReader(func(s *session) error { return a.session(ctx, s) })
		if err := read(sessions.add); err != nil {
			return nil, err
		}
		if err := sessions.flush(); err != nil {
			return nil, err
		}
		if err := a.flush(ctx); err != nil {
			return nil, err
		}
		a.prog.Done()
		return a.metrics, nil
	})
}

// assembler turns sessions into segments and writes them in shards, with a
// row receipt naming the sessions of each shard so a rerun resumes there.
type assembler struct {
	w       *dataset.Writer
	part    dataset.Part
	opts    assembly.Options
	arrow   records.ArrowOptions
	prog    *stagecmd.Progress
	pending []records.Trajectory
	ids     []string
	tokens  int
	metrics map[string]any
}

func (a *assembler) count(key string, n int) {
	if a.metrics == nil {
		a.metrics = map[string]any{}
	}
	v, _ := a.metrics[key].(int)
	a.metrics[key] = v + n
}

func (a *assembler) session(ctx context.Context, s *session) error {
	if err := ctx.Err(); err != nil {
		return err // a signal: stop reading here, not at the end of the input
	}
	if !ownsSession(a.part, s.id) || a.w.Done(s.id) {
		return nil
	}
	segs, err := assembleSession(s, a.opts)
	if err != nil {
		return stagecmd.BadInputError{Err: err}
	}
	a.prog.Add(1)
	a.count("sessions", 1)
	a.count("turns", len(s.turns))
	a.count("segments", len(segs))
	if len(segs) == 0 {
		a.count("sessions_without_segments", 1)
	}
	for _, t := range s.turns {
		a.count("sampled_tokens", len(t.OutputIDs))
	}
	trained := 0
	for _, seg := range segs {
		a.tokens += len(seg.Tokens)
		for _, m := range seg.LossMask {
			trained += int(m)
		}
	}
	a.count("trained_tokens", trained)
	a.pending = append(a.pending, segs...)
	a.ids = append(a.ids, s.id)
	if a.tokens >= shardTokens {
		return a.flush(ctx)
	}
	return nil
}

func (a *assembler) flush(ctx context.Context) error {
	if len(a.ids) == 0 {
		return nil
	}
	segs := a.pending
	_, err := a.w.WriteShard(ctx, int64(len(segs)), a.ids, func(out io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(out, a.arrow)
		if err != nil {
			return err
		}
		if err := enc.Write(segs...); err != nil {
			return err
		}
		return enc.Close()
	})
	a.pending, a.ids, a.tokens = nil, nil, 0
	return err
}

// isNullText reports whether s is JSON null, white space around it aside
// (strings.TrimSpace(s) == "null"). A message, an object, is told from its
// first byte: the far end of its text is not read ahead of the scan that
// reads it front to back.
func isNullText(s string) bool {
	if len(s) > 0 && s[0] == '{' {
		return false
	}
	return strings.TrimSpace(s) == "null"
}

// stringBytes is str's bytes without a copy. Nothing may write to them: the
// turn records' strings are immutable, and assembly only reads messages.
func stringBytes(str string) []byte {
	return unsafe.Slice(unsafe.StringData(str), len(str))
}

// assembleSession runs one session's turns through trajectory assembly.
func assembleSession(s *session, opts assembly.Options) ([]records.Trajectory, error) {
	sess := assembly.NewSession(opts)
	first := s.turns[0]
	base := assembly.Base{RolloutID: first.RolloutID, Index: first.Index, GroupIndex: first.GroupIndex}
	// A turn of an agent session typically adds its response and a tool
	// result or two to the history: room for three a turn spares the
	// splitter most regrowths of the session's message list.
	split := assembly.NewSplitter(8 + 3*len(s.turns))
	for i := range s.turns {
		t := &s.turns[i]
		if t.RolloutID != base.RolloutID || t.Index != base.Index || t.GroupIndex != base.GroupIndex {
			return nil, fmt.Errorf("session %q: turn %d has ids (rollout_id %d, index %d, group_index %d), turn %d has (%d, %d, %d): a session belongs to one agent run",
				s.id, t.Turn, t.RolloutID, t.Index, t.GroupIndex, first.Turn, base.RolloutID, base.Index, base.GroupIndex)
		}
		if t.Reward != nil {
			base.Reward = t.Reward
		}
		if t.MaxContextTokens > 0 {
			base.MaxSampleTokens = int(t.MaxContextTokens)
		}
		msgs, err := split.Split(stringBytes(t.PromptMessages))
		if err != nil {
			return nil, fmt.Errorf("session %q turn %d: %w", s.id, t.Turn, err)
		}
		var resp json.RawMessage
		if t.ResponseMessage != nil && !isNullText(*t.ResponseMessage) {
			resp = stringBytes(*t.ResponseMessage) // read only, as the prompt messages
		}
		err = sess.Record(assembly.Turn{
			PromptIDs: t.PromptIDs, OutputIDs: t.OutputIDs, OutputLogProbs: t.OutputLogProbs,
			FinishReason: t.FinishReason, IllFormed: t.IllFormed, PromptMessages: msgs, ResponseMessage: resp,
			Replay: t.Replay,
		})
		if err != nil {
			return nil, fmt.Errorf("session %q turn %d: %w", s.id, t.Turn, err)
		}
	}
	segs, err := sess.Segments(base)
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", s.id, err)
	}
	return segs, nil
}
