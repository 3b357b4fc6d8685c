package engine

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// routedExperts decodes choices[0].routed_experts: base64 of a .npy array of
// shape (positions, layers, experts per token), positions = prompt+output−1
// (docs/engine-wire.md §5.4 B; docs/adapter.md §1.3). The integer dtype is not
// documented, so any little-endian or byte-sized integer dtype is read.
func routedExperts(route string, raw json.RawMessage, positions int) ([]int32, []int32, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, nil, replyErr(route, ReasonBadRoutedExperts, "routed_experts is not a base64 string: %v", err)
	}
	data, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, nil, replyErr(route, ReasonBadRoutedExperts, "routed_experts: %v", err)
	}
	vals, shape, err := decodeNpy(data)
	if err != nil {
		return nil, nil, replyErr(route, ReasonBadRoutedExperts, "routed_experts: %v", err)
	}
	if len(shape) != 3 {
		return nil, nil, replyErr(route, ReasonBadRoutedExperts, "routed_experts has shape %v, want 3 dimensions", shape)
	}
	if int(shape[0]) != positions {
		return nil, nil, replyErr(route, ReasonBadRoutedExperts, "routed_experts covers %d positions, want prompt+output−1 = %d", shape[0], positions)
	}
	return vals, shape, nil
}

var (
	npyMagic = []byte("\x93NUMPY")
	npyDescr = regexp.MustCompile(`'descr':\s*'([^']*)'`)
	npyOrder = regexp.MustCompile(`'fortran_order':\s*(True|False)`)
	npyShape = regexp.MustCompile(`'shape':\s*\(([^)]*)\)`)
)

// decodeNpy reads a C-order integer .npy array into int32 values.
func decodeNpy(b []byte) ([]int32, []int32, error) {
	if len(b) < 10 || !bytes.Equal(b[:6], npyMagic) {
		return nil, nil, fmt.Errorf("not a .npy array")
	}
	var hlen, start int
	switch b[6] {
	case 1:
		hlen, start = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, nil, fmt.Errorf("truncated .npy header")
		}
		hlen, start = int(binary.LittleEndian.Uint32(b[8:12])), 12
	default:
		return nil, nil, fmt.Errorf(".npy version %d", b[6])
	}
	if start+hlen > len(b) {
		return nil, nil, fmt.Errorf("truncated .npy header")
	}
	hdr := string(b[start : start+hlen])
	body := b[start+hlen:]
	d, o, sh := npyDescr.FindStringSubmatch(hdr), npyOrder.FindStringSubmatch(hdr), npyShape.FindStringSubmatch(hdr)
	if d == nil || o == nil || sh == nil {
		return nil, nil, fmt.Errorf(".npy header %q", hdr)
	}
	if o[1] != "False" {
		return nil, nil, fmt.Errorf(".npy array is Fortran-ordered")
	}
	var shape []int32
	count := 1
	for _, f := range strings.Split(sh[1], ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 || v > math.MaxInt32 {
			return nil, nil, fmt.Errorf(".npy shape %q", sh[1])
		}
		shape = append(shape, int32(v))
		count *= v
		if count > math.MaxInt32 {
			return nil, nil, fmt.Errorf(".npy shape %q too large", sh[1])
		}
	}
	descr := d[1]
	if len(descr) < 3 {
		return nil, nil, fmt.Errorf(".npy dtype %q", descr)
	}
	size, err := strconv.Atoi(descr[2:])
	kind := descr[1]
	if err != nil || (kind != 'i' && kind != 'u') || (size != 1 && size != 2 && size != 4 && size != 8) ||
		(size > 1 && descr[0] != '<') {
		return nil, nil, fmt.Errorf(".npy dtype %q: want a little-endian integer type", descr)
	}
	if len(body) != count*size {
		return nil, nil, fmt.Errorf(".npy holds %d bytes, shape %v of %s needs %d", len(body), shape, descr, count*size)
	}
	out := make([]int32, count)
	for i := range out {
		p := body[i*size:]
		var v int64
		switch {
		case size == 1 && kind == 'i':
			v = int64(int8(p[0]))
		case size == 1:
			v = int64(p[0])
		case size == 2 && kind == 'i':
			v = int64(int16(binary.LittleEndian.Uint16(p)))
		case size == 2:
			v = int64(binary.LittleEndian.Uint16(p))
		case size == 4 && kind == 'i':
			v = int64(int32(binary.LittleEndian.Uint32(p)))
		case size == 4:
			v = int64(binary.LittleEndian.Uint32(p))
		case kind == 'i':
			v = int64(binary.LittleEndian.Uint64(p))
		default:
			u := binary.LittleEndian.Uint64(p)
			if u > math.MaxInt32 {
				return nil, nil, fmt.Errorf(".npy value %d out of int32 range", u)
			}
			v = int64(u)
		}
		if v < 0 || v > math.MaxInt32 {
			return nil, nil, fmt.Errorf(".npy value %d is not an expert index", v)
		}
		out[i] = int32(v)
	}
	return out, shape, nil
}
