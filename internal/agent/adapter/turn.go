package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/parse"
	"github.com/kilnrl/kiln/internal/agent/protocol"
)

// serveTurn runs one turn (docs/adapter.md §2.3 steps 3–13) and answers it.
func (s *Server) serveTurn(w http.ResponseWriter, r *http.Request, req *protocol.Request) {
	sess, perr := s.acquire(req.SessionID)
	if perr != nil {
		writeError(w, req.Protocol, perr)
		return
	}
	defer sess.inflight.Done()
	ka := s.keepAlive(w, req, protocol.ReplyOptions{IDs: s.opts.IDs, Created: s.opts.Clock().Unix()})
	fail := func(err error) {
		if pre := ka.end(); pre != nil {
			_, _ = w.Write(pre.Error(asProtocolError(err)))
			return
		}
		writeError(w, req.Protocol, asProtocolError(err))
	}

	// The turn ends with the client (docs/adapter.md §1.7) or with the session's
	// shutdown (docs/adapter.md §2.2).
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(sess.ctx, cancel)
	defer stop()

	select {
	case sess.turnSem <- struct{}{}:
	case <-ctx.Done():
		fail(errClientGone)
		return
	}
	defer func() { <-sess.turnSem }()

	started := s.opts.Clock()
	hashes := sess.memo.messages(req.Messages)
	tools := sess.memo.tools(req.Tools)
	t, rep, err := s.runTurn(ctx, sess, req, hashes, tools)
	if err != nil {
		fail(err)
		return
	}

	// Step 10: write the reply whole (after the keep-alive frames, when
	// the stream has begun); record only when it was delivered.
	var buf bytes.Buffer
	pre := ka.end()
	if pre != nil {
		err = pre.Reply(&buf, rep)
	} else {
		err = protocol.WriteReply(&buf, req, rep, protocol.ReplyOptions{IDs: s.opts.IDs, Created: started.Unix()})
	}
	if err != nil {
		fail(fmt.Errorf("adapter: encoding reply: %w", err))
		return
	}
	if pre == nil {
		if req.Stream {
			setSSEHeaders(w)
		} else {
			w.Header().Set("Content-Type", protocol.ContentType(req))
		}
		// The reply is whole, stream or not: with its length the server
		// sends it as it is, without chunk framing and a terminating write.
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		w.WriteHeader(http.StatusOK)
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// The whole reply was handed to the connection: record the turn even
	// if the client hangs up now (a CLI exits as soon as it has the last
	// event, which cancels the request context).

	// Step 12.
	ms := started.UnixMilli()
	dur := s.opts.Clock().Sub(started).Milliseconds()
	t.StartedMs, t.DurationMs = &ms, &dur
	t.Turn = int32(len(sess.turns))
	sess.turns = append(sess.turns, *t)
	sess.msgs.record(req.Messages)
	hashes = sess.storeHashes(hashes, canonicalHash([]byte(*t.ResponseMessage)))
	sess.prefixes = append(sess.prefixes, prefix{msgs: hashes, tools: tools,
		key: prefixKey(hashes, tools), turn: len(sess.turns) - 1})
}

// TurnSeed is the sampling seed of a session's n-th turn (from 0) under
// SessionOptions.Seed: SplitMix64 of the pair, kept to 31 bits so every
// engine takes it as a plain int.
func TurnSeed(session int64, n int) int64 {
	z := uint64(session) + uint64(n+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return int64((z ^ z>>31) >> 33)
}

// runTurn is steps 4–8: prompt ids, engine call, decode, parse, reply.
// Nothing is recorded here; any error fails the request.
func (s *Server) runTurn(ctx context.Context, sess *session, req *protocol.Request, hashes []digest, tools digest) (*records.Turn, *protocol.Reply, error) {
	eng := s.opts.Engine
	render := func(ctx context.Context, msgs []json.RawMessage, gen bool) ([]int32, error) {
		return eng.TokenizeChat(ctx, engine.ChatRequest{Messages: msgs, Tools: req.Tools,
			AddGenerationPrompt: gen, ChatTemplateKwargs: sess.kwargs, Memo: &sess.calls})
	}
	if len(req.Messages) == 0 {
		return nil, nil, &protocol.Error{Status: http.StatusBadRequest, Type: "invalid_request_error",
			Message: "adapter: the request has no messages"}
	}
	full, err := render(ctx, req.Messages, true)
	if err != nil {
		return nil, nil, fmt.Errorf("adapter: rendering the prompt: %w", err)
	}
	prompt, _, err := s.reusePrompt(ctx, sess, req.Messages, hashes, tools, full, render)
	if err != nil {
		return nil, nil, fmt.Errorf("adapter: prefix reuse: %w", err)
	}
	if len(prompt) == 0 {
		return nil, nil, fmt.Errorf("adapter: the chat template rendered an empty prompt")
	}

	// docs/adapter.md §1.4 and §1.5.
	sp := s.sampling(sess, req.Sampling)
	if sp.Seed == nil && sess.opts.Seed != nil {
		seed := TurnSeed(*sess.opts.Seed, len(sess.turns))
		sp.Seed = &seed
	}
	limit := contextLimit(sess.opts.MaxContextTokens, eng.ContextLength())
	if limit > 0 {
		n, err := engine.ClampMaxTokens(len(prompt), sp.MaxTokens, limit)
		if err != nil {
			return nil, nil, s.overflow(req, err)
		}
		sp.MaxTokens = n
	}
	gr := engine.GenerateRequest{PromptIDs: prompt, Memo: &sess.calls, Sampling: sp, SessionID: req.SessionID,
		ReturnSamplingMask: !s.opts.NoTopPReplay && sp.TopP != nil && *sp.TopP < 1}
	gen, err := eng.Generate(ctx, gr)
	if err != nil {
		var ce *engine.ContextOverflowError
		if errors.As(err, &ce) {
			return nil, nil, s.overflow(req, err)
		}
		return nil, nil, err
	}

	// Step 7.
	raw := ""
	if len(gen.OutputIDs) > 0 {
		if raw, err = eng.Detokenize(ctx, gen.OutputIDs); err != nil {
			return nil, nil, fmt.Errorf("adapter: decoding the output: %w", err)
		}
	}
	out := parse.Parse(raw, parse.Options{Qwen3Reasoning: s.opts.ReasoningParser == "qwen3",
		ToolSet: sess.memo.toolSet(), ToolFormat: s.toolFmt, TrailingSpecials: s.trailing})
	rep := &protocol.Reply{Reasoning: out.Reasoning, Content: out.Text, FinishReason: gen.FinishReason,
		PromptTokens: len(prompt), OutputTokens: len(gen.OutputIDs)}
	for _, c := range out.Calls {
		rep.Calls = append(rep.Calls, protocol.Call{Name: c.Name, Arguments: c.Arguments})
	}

	// Step 8 and the record of step 12.
	resp := string(protocol.AssistantMessage(req, rep))
	t := &records.Turn{
		RolloutID: sess.opts.RolloutID, Index: sess.opts.Index, GroupIndex: sess.opts.GroupIndex,
		Session: sess.id, PromptIDs: prompt, OutputIDs: gen.OutputIDs, OutputLogProbs: gen.LogProbs,
		FinishReason: gen.FinishReason, IllFormed: out.IllFormed,
		ResponseMessage:  &resp, // PromptMessages: by Finish, from the session's messageStore
		MaxContextTokens: int32(limit),
	}
	if gr.ReturnSamplingMask {
		t.TopPTokenIDs, t.TopPTokenOffsets = gen.TopPTokenIDs, gen.TopPTokenOffsets
	}
	return t, rep, nil
}

func (s *Server) overflow(req *protocol.Request, err error) error {
	var ce *engine.ContextOverflowError
	if errors.As(err, &ce) {
		return protocol.ContextOverflow(req.Protocol, ce.PromptTokens, ce.MaxContext)
	}
	return err
}

// contextLimit is docs/adapter.md §1.5: the session's limit and the server's, the
// smaller of the two that are set; 0 when neither is.
func contextLimit(session, server int) int {
	switch {
	case session > 0 && server > 0:
		return min(session, server)
	case session > 0:
		return session
	default:
		return max(server, 0)
	}
}

// sampling is docs/adapter.md §1.4 step A (overlays) mapped onto the engine's params.
func (s *Server) sampling(sess *session, c protocol.Sampling) engine.SamplingParams {
	sp := copySampling(sess.sampling)
	if sp.MaxTokens <= 0 {
		sp.MaxTokens = DefaultMaxTokens
	}
	if c.MaxTokens != nil && *c.MaxTokens < sp.MaxTokens {
		sp.MaxTokens = *c.MaxTokens
	}
	if s.opts.MaxTurnTokens > 0 && s.opts.MaxTurnTokens < sp.MaxTokens {
		sp.MaxTokens = s.opts.MaxTurnTokens
	}
	if sp.MaxTokens < 1 {
		sp.MaxTokens = 1
	}
	if c.Temperature.Set {
		sp.Temperature = c.Temperature.Value
	}
	if c.TopP.Set {
		sp.TopP = c.TopP.Value
	}
	if c.TopK.Set {
		sp.TopK = nil
		if c.TopK.Value != nil {
			k := int(*c.TopK.Value)
			sp.TopK = &k
		}
	}
	// top_k is sent only when > 0 or == -1 (docs/adapter.md §1.4 B).
	if sp.TopK != nil && *sp.TopK <= 0 && *sp.TopK != -1 {
		sp.TopK = nil
	}
	if len(c.Stop) > 0 {
		sp.Stop = slices.Clone(c.Stop)
	}
	if len(sp.Stop) > 0 {
		sp.IncludeStopStrInOutput = true // no_stop_trim defaults to true
	}
	if sp.MinTokens > sp.MaxTokens {
		sp.MinTokens = sp.MaxTokens
	}
	return sp
}

// parseTools reads the function names and parameter schemas the parser
// needs from the request's OpenAI function schemas.
func parseTools(tools []json.RawMessage) []parse.Tool {
	var out []parse.Tool
	for _, raw := range tools {
		var t struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if json.Unmarshal(raw, &t) == nil && t.Function.Name != "" {
			out = append(out, parse.Tool{Name: t.Function.Name, Parameters: t.Function.Parameters})
		}
	}
	return out
}
