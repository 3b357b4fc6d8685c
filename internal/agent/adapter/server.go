package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/parse"
	"github.com/kilnrl/kiln/internal/agent/protocol"
)

// MaxBodyBytes is the largest request body accepted (docs/adapter.md §2.3 step 1).
const MaxBodyBytes = 64 << 20

// DefaultMaxTokens is max_new_tokens before session defaults (docs/adapter.md §1.4 A.1).
const DefaultMaxTokens = 4096

// Options configure a Server.
type Options struct {
	// Engine renders, generates and decodes. Required.
	Engine *engine.Client
	// Special are the served checkpoint's special tokens; AllSpecialIDs is
	// the set prefix reuse checks the previous turn's last output id against
	// (docs/adapter.md §3 step 3), and the texts of StopIDs/IMEnd are stripped from the
	// end of visible text (docs/adapter.md §6.3 recommendation).
	Special engine.SpecialTokens
	// Sampling are the default sampling params of sessions opened without
	// their own (docs/adapter.md §1.4 A.2). MaxTokens 0 means DefaultMaxTokens.
	Sampling engine.SamplingParams
	// ChatTemplateKwargs is the default chat_template_kwargs JSON object of
	// sessions opened without their own; nil: none.
	ChatTemplateKwargs json.RawMessage
	// MaxTurnTokens caps max_tokens of every turn (0: no cap).
	MaxTurnTokens int
	// ReasoningParser is "qwen3" or "" (none).
	ReasoningParser string
	// ToolParser is "qwen3_coder", "hermes" or "" (only the XML fallback).
	ToolParser string
	// TrailingSpecials are special-token texts stripped from the end of the
	// visible text (and so of the recorded assistant message). nil: derived
	// from Special (texts of StopIDs and IMEnd), else parse.QwenEndTokens.
	TrailingSpecials []string
	// AutoOpen serves requests for sessions never opened with an empty
	// session (no defaults beyond Options, no context limit), as the
	// reference does (docs/adapter.md §2.2, store.setdefault). nil means true. With
	// false such requests are 404 in the protocol's error shape.
	AutoOpen *bool
	// MaxTurnsPerSession answers 429 rate_limit_error once a session has
	// been asked this many turns (docs/adapter.md §2.2); 0: unlimited.
	MaxTurnsPerSession int
	// ShutdownWait is how long Finish/Drop wait for in-flight turns before
	// cancelling them (docs/adapter.md §2.2); 0 means 5s.
	ShutdownWait time.Duration
	// ReuseAttempts is how many stored prefixes may have their anchor
	// rendered per turn (docs/adapter.md §3 step 5). 0 means 1, which bounds a turn to
	// 2 /tokenize calls; a large value is the reference's unbounded search.
	ReuseAttempts int
	// KeepAlive is how long a streamed turn may go unanswered before the
	// adapter sends the stream's head and the protocol's keep-alive frame,
	// repeated as often until the reply follows in the same stream
	// (protocol.Prelude). A turn that fails after that ends the stream
	// with the protocol's error event instead of an error status. 0 means
	// DefaultKeepAlive; negative, never.
	KeepAlive time.Duration
	// NoTopPReplay turns off return_sampling_mask for top_p < 1 (docs/adapter.md
	// §1.4 B, docs/adapter.md §2.4 rule 7): for engines that cannot return the nucleus.
	NoTopPReplay bool
	// IDs mints wire ids (nil: random); Clock gives reply timestamps and
	// turn start times (nil: time.Now). For tests.
	IDs   protocol.IDSource
	Clock func() time.Time
}

// SessionOptions are what Open stores for one session (copied).
type SessionOptions struct {
	// RolloutID, Index and GroupIndex identify the agent run in records.
	RolloutID, Index, GroupIndex int64
	// Sampling overrides Options.Sampling when non-nil.
	Sampling *engine.SamplingParams
	// MaxContextTokens limits prompt+output (docs/adapter.md §1.5); 0: the engine's
	// context length only.
	MaxContextTokens int
	// ChatTemplateKwargs overrides Options.ChatTemplateKwargs when non-nil.
	ChatTemplateKwargs json.RawMessage
	// Seed, when non-nil, makes the session reproducible: a model call
	// whose sampling has no seed of its own samples with TurnSeed(*Seed,
	// n) for the session's n-th recorded turn (docs/adapter.md §1.4), so
	// an engine that draws as a function of the seed (vLLM, serve.py)
	// gives the same tokens whatever else it batches.
	Seed *int64
}

// Server is the adapter: an http.Handler serving the client protocols,
// plus the session API (Open, Finish, Drop).
type Server struct {
	opts     Options
	mux      *http.ServeMux
	toolFmt  parse.Format
	trailing []string
	specials map[int32]bool
	// blankTails remembers, per short id sequence, whether it detokenizes
	// to white space only (reuse step 6): the separator after an
	// end-of-message token is the same few ids on every turn, and the
	// tokenizer never changes under a running server.
	blankTails sync.Map // string(ids as bytes) -> bool
	// histories carry each Anthropic session's parsed and translated
	// history to its next request (protocol.History), by session id.
	histories sync.Map // string -> *protocol.History

	mu       sync.Mutex
	sessions map[string]*session
	closed   map[string]bool
	order    []string // session ids in the order they were opened
}

// New returns a server. It panics on an unknown parser name or a nil
// Engine (configuration errors).
func New(opts Options) *Server {
	if opts.Engine == nil {
		panic("adapter: Options.Engine is nil")
	}
	switch opts.ReasoningParser {
	case "", "qwen3":
	default:
		panic(fmt.Sprintf("adapter: unknown reasoning parser %q", opts.ReasoningParser))
	}
	f, ok := parse.ParseFormat(opts.ToolParser)
	if !ok {
		panic(fmt.Sprintf("adapter: unknown tool parser %q", opts.ToolParser))
	}
	if opts.ShutdownWait <= 0 {
		opts.ShutdownWait = 5 * time.Second
	}
	if opts.ReuseAttempts <= 0 {
		opts.ReuseAttempts = 1
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.IDs == nil {
		opts.IDs = protocol.RandomIDs()
	}
	s := &Server{opts: opts, toolFmt: f, sessions: map[string]*session{}, closed: map[string]bool{},
		specials: map[int32]bool{}}
	for _, id := range opts.Special.AllSpecialIDs {
		s.specials[id] = true
	}
	s.trailing = opts.TrailingSpecials
	if s.trailing == nil {
		stop := map[int32]bool{}
		for _, id := range opts.Special.StopIDs {
			stop[id] = true
		}
		if opts.Special.IMEnd >= 0 && len(opts.Special.ByContent) > 0 {
			stop[opts.Special.IMEnd] = true
		}
		for text, id := range opts.Special.ByContent {
			if stop[id] && text != "" {
				s.trailing = append(s.trailing, text)
			}
		}
		if len(s.trailing) == 0 {
			s.trailing = parse.QwenEndTokens()
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.turnHandler(protocol.Anthropic, s.decodeAnthropic))
	mux.HandleFunc("POST /v1/responses", s.turnHandler(protocol.Responses, s.decodeResponses))
	mux.HandleFunc("POST /v1/chat/completions", s.turnHandler(protocol.Chat, s.decodeChat))
	mux.HandleFunc("POST /v1/messages/count_tokens", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		writeJSON(w, http.StatusOK, protocol.CountTokensBody())
	})
	ok200 := func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, protocol.OKBody()) }
	mux.HandleFunc("GET /v1/models", ok200)
	mux.HandleFunc("GET /healthz", ok200)
	mux.HandleFunc("HEAD /api/hello", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux = mux
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", protocol.ContentTypeJSON)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, p protocol.Protocol, e *protocol.Error) {
	writeJSON(w, e.Status, e.Body(p))
}

// decodeAnthropic decodes with the session's history.
func (s *Server) decodeAnthropic(h http.Header, body []byte) (protocol.Request, error) {
	return protocol.DecodeAnthropicHistory(h, body, s.history(protocol.AnthropicSessionID(h)))
}

// decodeResponses decodes with the session's history — the session named
// by a Bearer token, as Codex sends, or in the body — when the session is
// known before decoding (protocol.OpenAISessionID); otherwise without.
func (s *Server) decodeResponses(h http.Header, body []byte) (protocol.Request, error) {
	if id, ok := protocol.OpenAISessionID(h, body); ok {
		return protocol.DecodeResponsesHistory(h, body, s.history(id))
	}
	return protocol.DecodeResponses(h, body)
}

// decodeChat is decodeResponses for Chat Completions requests.
func (s *Server) decodeChat(h http.Header, body []byte) (protocol.Request, error) {
	if id, ok := protocol.OpenAISessionID(h, body); ok {
		return protocol.DecodeChatHistory(h, body, s.history(id))
	}
	return protocol.DecodeChat(h, body)
}

// history is the decode History of session id; nil for a closed session
// (whose requests fail anyway).
func (s *Server) history(id string) *protocol.History {
	s.mu.Lock()
	closed := s.closed[id]
	s.mu.Unlock()
	if closed {
		return nil
	}
	v, _ := s.histories.LoadOrStore(id, &protocol.History{})
	return v.(*protocol.History)
}

// readBody reads a request body of at most MaxBodyBytes, in one
// allocation when the client sent its length (the decoded request keeps
// slices of it).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	if r.ContentLength <= 0 || r.ContentLength > MaxBodyBytes {
		return io.ReadAll(rd)
	}
	body := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	return body, nil
}

type decoder func(http.Header, []byte) (protocol.Request, error)

func (s *Server) turnHandler(p protocol.Protocol, decode decoder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(w, r)
		if err != nil {
			writeError(w, p, &protocol.Error{Status: http.StatusBadRequest, Type: "invalid_request_error",
				Message: "reading request body: " + err.Error()})
			return
		}
		req, err := decode(r.Header, body)
		if err != nil {
			writeError(w, p, asProtocolError(err))
			return
		}
		s.serveTurn(w, r, &req)
	}
}

// errClientGone marks a turn abandoned because the client went away.
var errClientGone = errors.New("client disconnected")

// asProtocolError maps any turn failure to the HTTP error answered.
func asProtocolError(err error) *protocol.Error {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe
	}
	var he *engine.HTTPError
	if errors.As(err, &he) {
		return &protocol.Error{Status: http.StatusInternalServerError, Type: "api_error",
			Message: fmt.Sprintf("vllm upstream %d: %s", he.Status, he.Message)}
	}
	var re *engine.ReplyError
	if errors.As(err, &re) {
		return &protocol.Error{Status: http.StatusInternalServerError, Type: "api_error",
			Message: "invalid engine reply: " + re.Error()}
	}
	if errors.Is(err, errClientGone) || errors.Is(err, context.Canceled) {
		return &protocol.Error{Status: 499, Type: "api_error", Message: "client disconnected"}
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "adapter") {
		msg = "adapter: " + msg
	}
	return &protocol.Error{Status: http.StatusInternalServerError, Type: "api_error", Message: msg}
}
