package sync

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// maxHeaderLen bounds a safetensors header: real ones are kilobytes to a
// few megabytes; a larger length is a damaged or hostile file, refused
// before anything is allocated for it.
const maxHeaderLen = 100 << 20

// dtypeWidth is the byte width of each safetensors dtype whose elements
// are whole bytes.
var dtypeWidth = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

// stTensor is one tensor of a safetensors file as its header describes it.
type stTensor struct {
	Name  string
	DType string
	Shape []int64
	// Offset is where its bytes start in the file (past the 8-byte length
	// and the header), Size how many there are.
	Offset, Size int64
}

// stHeader is a checked safetensors header.
type stHeader struct {
	// Header is the file's first DataStart bytes: the length and the JSON,
	// kept to compare with another version's file byte for byte.
	Header []byte
	// DataStart is 8 + the header's length: where tensor bytes begin.
	DataStart int64
	Metadata  map[string]string
	// Tensors are in file order.
	Tensors []stTensor
}

// readSafetensorsHeader reads and checks the header of the safetensors
// file r (size bytes, named file in errors): a bounded length, JSON whose
// entries have a known dtype and non-negative shape, byte ranges in order,
// non-overlapping and covering the data area exactly, each as long as its
// shape times its dtype's width, and a file of exactly 8 + header + data
// bytes. Any disagreement is bad input (exit 5) naming the file and, where
// there is one, the tensor.
func readSafetensorsHeader(r io.ReaderAt, size int64, file string) (*stHeader, error) {
	bad := func(format string, args ...any) error {
		return stagecmd.BadInputf("safetensors %q: %s: re-save the checkpoint, it is not one safetensors can load", file, fmt.Sprintf(format, args...))
	}
	if size < 8 {
		return nil, bad("%d bytes, shorter than the 8-byte header length", size)
	}
	var lb [8]byte
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors %q: reading the header length: %w", file, err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n == 0 || n > maxHeaderLen || int64(n) > size-8 {
		return nil, bad("header length %d (file of %d bytes; at most %d)", n, size, maxHeaderLen)
	}
	h := &stHeader{Header: make([]byte, 8+n), DataStart: 8 + int64(n)}
	if _, err := r.ReadAt(h.Header, 0); err != nil {
		return nil, fmt.Errorf("safetensors %q: reading the header: %w", file, err)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(h.Header[8:]))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, bad("header is not a JSON object: %v", err)
	}
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, bad("__metadata__ is not an object of strings: %v", err)
			}
			continue
		}
		var info struct {
			DType       string  `json:"dtype"`
			Shape       []int64 `json:"shape"`
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &info); err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		width, ok := dtypeWidth[info.DType]
		if !ok {
			return nil, bad("tensor %q: dtype %q is not one this stage knows", name, info.DType)
		}
		if len(info.DataOffsets) != 2 || info.DataOffsets[0] < 0 || info.DataOffsets[1] < info.DataOffsets[0] {
			return nil, bad("tensor %q: data_offsets %v", name, info.DataOffsets)
		}
		elems := int64(1)
		for _, d := range info.Shape {
			if d < 0 || (d > 0 && elems > math.MaxInt64/width/d) {
				return nil, bad("tensor %q: shape %v", name, info.Shape)
			}
			elems *= d
		}
		if info.Shape == nil {
			info.Shape = []int64{}
		}
		t := stTensor{Name: name, DType: info.DType, Shape: info.Shape,
			Offset: h.DataStart + info.DataOffsets[0], Size: info.DataOffsets[1] - info.DataOffsets[0]}
		if t.Size != elems*width {
			return nil, bad("tensor %q: %d bytes, but shape %v of %s needs %d", name, t.Size, info.Shape, info.DType, elems*width)
		}
		h.Tensors = append(h.Tensors, t)
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Offset != b.Offset {
			return a.Offset < b.Offset
		}
		return a.Size < b.Size
	})
	at := h.DataStart
	for _, t := range h.Tensors {
		if t.Offset != at {
			what := "a gap before"
			if t.Offset < at {
				what = "overlapping bytes at"
			}
			return nil, bad("tensor %q: %s data offset %d (expected %d)", t.Name, what, t.Offset-h.DataStart, at-h.DataStart)
		}
		at += t.Size
	}
	if at != size {
		return nil, bad("the tensors end at byte %d, the file has %d", at, size)
	}
	return h, nil
}
