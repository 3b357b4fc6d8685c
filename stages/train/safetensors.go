package train

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Tensor is one named 1-D tensor of a safetensors file. Data is one of
// []int32, []int64, []uint8 or []float32 (dtypes I32, I64, U8, F32).
type Tensor struct {
	Name string
	Data any
}

func dtypeOf(data any) (dtype string, n, width int, err error) {
	switch d := data.(type) {
	case []int32:
		return "I32", len(d), 4, nil
	case []int64:
		return "I64", len(d), 8, nil
	case []uint8:
		return "U8", len(d), 1, nil
	case []float32:
		return "F32", len(d), 4, nil
	}
	return "", 0, 0, fmt.Errorf("safetensors: unsupported tensor data %T", data)
}

type tensorInfo struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// WriteSafetensors writes tensors to w in the safetensors format: an
// 8-byte little-endian header length, the JSON header (each tensor's
// dtype, shape and byte range, and "__metadata__" with string values),
// padded with spaces to a multiple of 8 bytes, then the raw little-endian
// data, tensors in name order (the header's order) without gaps.
func WriteSafetensors(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	ts := append([]Tensor(nil), tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for i, t := range ts {
		if t.Name == "" || t.Name == "__metadata__" || (i > 0 && ts[i-1].Name == t.Name) {
			return fmt.Errorf("safetensors: bad or repeated tensor name %q", t.Name)
		}
		dt, n, width, err := dtypeOf(t.Data)
		if err != nil {
			return err
		}
		size := int64(n * width)
		header[t.Name] = tensorInfo{DType: dt, Shape: []int{n}, DataOffsets: [2]int64{off, off + size}}
		off += size
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(h)))
	bw.Write(lenBuf[:])
	bw.Write(h)
	var b [8]byte
	for _, t := range ts {
		switch d := t.Data.(type) {
		case []int32:
			for _, v := range d {
				binary.LittleEndian.PutUint32(b[:4], uint32(v))
				bw.Write(b[:4])
			}
		case []int64:
			for _, v := range d {
				binary.LittleEndian.PutUint64(b[:], uint64(v))
				bw.Write(b[:])
			}
		case []uint8:
			bw.Write(d)
		case []float32:
			for _, v := range d {
				binary.LittleEndian.PutUint32(b[:4], math.Float32bits(v))
				bw.Write(b[:4])
			}
		}
	}
	return bw.Flush()
}

// writeSafetensorsFile writes the file at path (created, not replaced in
// place: the work directory is private to one run).
func writeSafetensorsFile(path string, tensors []Tensor, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteSafetensors(f, tensors, metadata); err != nil {
		f.Close()
		return fmt.Errorf("writing %q: %w", path, err)
	}
	return f.Close()
}

// ReadSafetensors parses a safetensors file written by WriteSafetensors
// (1-D tensors of the four dtypes) back into tensors by name and the
// metadata.
func ReadSafetensors(data []byte) (map[string]any, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, fmt.Errorf("safetensors: %d bytes, shorter than the header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > uint64(len(data)-8) {
		return nil, nil, fmt.Errorf("safetensors: header length %d beyond the file's %d bytes", n, len(data))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		return nil, nil, fmt.Errorf("safetensors header: %w", err)
	}
	body := data[8+n:]
	out := map[string]any{}
	var meta map[string]string
	for name, r := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(r, &meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors metadata: %w", err)
			}
			continue
		}
		var ti tensorInfo
		if err := json.Unmarshal(r, &ti); err != nil {
			return nil, nil, fmt.Errorf("safetensors tensor %q: %w", name, err)
		}
		lo, hi := ti.DataOffsets[0], ti.DataOffsets[1]
		if lo < 0 || hi < lo || hi > int64(len(body)) || len(ti.Shape) != 1 {
			return nil, nil, fmt.Errorf("safetensors tensor %q: bad range %v or shape %v", name, ti.DataOffsets, ti.Shape)
		}
		b := body[lo:hi]
		switch ti.DType {
		case "I32", "F32":
			if len(b) != 4*ti.Shape[0] {
				return nil, nil, fmt.Errorf("safetensors tensor %q: %d bytes for shape %v", name, len(b), ti.Shape)
			}
			if ti.DType == "I32" {
				v := make([]int32, ti.Shape[0])
				for i := range v {
					v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
				}
				out[name] = v
			} else {
				v := make([]float32, ti.Shape[0])
				for i := range v {
					v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
				}
				out[name] = v
			}
		case "I64":
			if len(b) != 8*ti.Shape[0] {
				return nil, nil, fmt.Errorf("safetensors tensor %q: %d bytes for shape %v", name, len(b), ti.Shape)
			}
			v := make([]int64, ti.Shape[0])
			for i := range v {
				v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
			}
			out[name] = v
		case "U8":
			out[name] = append([]uint8{}, b...)
		default:
			return nil, nil, fmt.Errorf("safetensors tensor %q: dtype %q", name, ti.DType)
		}
	}
	return out, meta, nil
}
