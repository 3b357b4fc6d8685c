package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sort"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// session is the turns of one agent session, in call order.
type session struct {
	id    string
	turns []records.Turn
}

// sessionReader streams sessions from turn records that arrive grouped by
// session, so memory holds one session at a time. A session whose turns are
// not contiguous is an error: kiln's rollout writes them contiguously, and
// other systems' files must be sorted by session first.
type sessionReader struct {
	cur  *session
	seen map[string]bool
	emit func(*session) error
}

func newSessionReader(emit func(*session) error) *sessionReader {
	return &sessionReader{seen: map[string]bool{}, emit: emit}
}

func (r *sessionReader) add(t records.Turn) error {
	if r.cur != nil && r.cur.id != t.Session {
		if err := r.flush(); err != nil {
			return err
		}
	}
	if r.cur == nil {
		if r.seen[t.Session] {
			return stagecmd.BadInputError{Err: fmt.Errorf("turns of session %q are not contiguous: group the input by session (kiln writes them so)", t.Session)}
		}
		r.seen[t.Session] = true
		r.cur = &session{id: t.Session}
	}
	r.cur.turns = append(r.cur.turns, t)
	return nil
}

func (r *sessionReader) flush() error {
	if r.cur == nil {
		return nil
	}
	s := r.cur
	r.cur = nil
	sort.SliceStable(s.turns, func(i, j int) bool { return s.turns[i].Turn < s.turns[j].Turn })
	return r.emit(s)
}

// ownsSession deals sessions to parts by a hash of their id, so a split
// does not depend on the order of the input.
func ownsSession(part dataset.Part, id string) bool {
	if part.Count <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32()%uint32(part.Count)) == part.Index
}

// readTurnsDataset streams a turns version.
func readTurnsDataset(ctx context.Context, v *dataset.Version, add func(records.Turn) error) error {
	return v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTurn(data, func(t *records.Turn) error { return add(*t) })
	})
}

// readTurnsJSONL streams turn records from JSON lines: one object per turn
// with the turns fields (records.TurnJSON); "turn" defaults to the row's
// position within its session.
//
// Each line is read by turnDecoder, which accepts exactly what encoding/json
// would and makes the same turn; a line it declines is decoded with
// encoding/json (into records.TurnJSON, unknown fields and text after the
// object refused, then ToTurn), which either makes the turn or says what is
// wrong, named by file and line. A turn without prompt ids, and a file
// without turns, are invalid input too. The turns' message text aliases the lines read (lineReader
// never reuses a line's storage).
func readTurnsJSONL(r io.Reader, name string, add func(records.Turn) error) error {
	lr := lineReader{r: r, chunk: 4 << 20}
	order := map[string]int32{}
	var dec turnDecoder
	turns := 0
	for lineNo := 1; ; lineNo++ {
		line, err := lr.next()
		if len(bytes.TrimSpace(line)) > 0 {
			t, hasTurn, ok := dec.decode(line)
			if ok {
				if !hasTurn {
					t.Turn = order[t.Session]
				}
			} else {
				var terr error
				if t, terr = decodeTurnJSON(line, order); terr != nil {
					return stagecmd.BadInputError{Err: fmt.Errorf("%s:%d: %w", name, lineNo, terr)}
				}
			}
			if ferr := checkTurnFields(t); ferr != nil {
				return stagecmd.BadInputError{Err: fmt.Errorf("%s:%d: %w", name, lineNo, ferr)}
			}
			order[t.Session]++
			turns++
			if aerr := add(t); aerr != nil {
				return aerr
			}
		}
		if errors.Is(err, io.EOF) {
			if turns == 0 {
				return stagecmd.BadInputError{Err: fmt.Errorf("%s: no turns in the file: nothing to assemble", name)}
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
	}
}

// decodeTurnJSON is the encoding/json reading of a line: the reference
// turnDecoder is held to, and the path of the lines it declines.
func decodeTurnJSON(line []byte, order map[string]int32) (records.Turn, error) {
	var j records.TurnJSON
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return records.Turn{}, err
	}
	if rest := bytes.TrimSpace(line[dec.InputOffset():]); len(rest) > 0 {
		return records.Turn{}, fmt.Errorf("text after the turn's object: %.40q", rest)
	}
	return j.ToTurn(order[j.Session])
}

// checkTurnFields refuses a turn that is valid as a record but lacks what
// assembly needs: without prompt ids it would make no segment, and the file
// would commit with its turns silently dropped. (An empty session is
// refused by the record's own validation.)
func checkTurnFields(t records.Turn) error {
	if len(t.PromptIDs) == 0 {
		return errors.New(`field "prompt_ids" is missing or empty`)
	}
	return nil
}

// lineReader splits a stream into lines as bufio.Reader.ReadBytes('\n')
// does — each line with its '\n', the last one without if the stream does
// not end in one, returned with the error that ended the stream — but
// reads the stream into chunks of its own and returns lines in place,
// without a copy each: a line's storage is never reused or written
// afterwards (only the unfinished line at a full chunk's end is copied into
// the next).
type lineReader struct {
	r     io.Reader
	chunk int    // the size of a chunk
	buf   []byte // the current chunk, read so far
	off   int    // where the next line starts in buf
	seen  int    // buf[off:seen] holds no '\n'
	err   error  // what ended the stream, once it has
}

func (l *lineReader) next() ([]byte, error) {
	for {
		if k := bytes.IndexByte(l.buf[l.seen:], '\n'); k >= 0 {
			end := l.seen + k + 1
			line := l.buf[l.off:end:end]
			l.off, l.seen = end, end
			return line, nil
		}
		l.seen = len(l.buf)
		if l.err != nil {
			line := l.buf[l.off:len(l.buf):len(l.buf)]
			l.off = len(l.buf)
			return line, l.err
		}
		if len(l.buf) == cap(l.buf) {
			// The chunk is full: the unfinished line moves to a fresh one.
			rest := l.buf[l.off:]
			buf := make([]byte, len(rest), max(l.chunk, 2*len(rest), 1))
			copy(buf, rest)
			l.buf, l.off = buf, 0
		}
		// Read into the chunk's free part, which no line returned reaches.
		var n int
		for empty := 0; n == 0 && l.err == nil; empty++ {
			if empty == 100 {
				l.err = io.ErrNoProgress // as bufio.Reader gives up
				break
			}
			n, l.err = l.r.Read(l.buf[len(l.buf):cap(l.buf)])
		}
		l.seen, l.buf = len(l.buf), l.buf[:len(l.buf)+n]
	}
}
