// Package tfevents writes TensorBoard event files: TFRecord-framed
// tensorflow.Event protocol buffers holding scalar summaries
// (docs/report.md §5). It is the small, stable part of the format that
// TensorBoard's readers and every tool that reads its logs understand:
//
//   - a TFRecord is uint64 length (little endian), uint32 masked CRC-32C of
//     those 8 bytes, the data, uint32 masked CRC-32C of the data; a masked
//     CRC is ((crc >> 15) | (crc << 17)) + 0xa282ead8;
//   - the first record is an Event with file_version "brain.Event:2";
//   - each further record is an Event{wall_time = 1, step = 2, summary = 5}
//     whose Summary{value = 1} holds Value{tag = 1, simple_value = 2}
//     (a float32: TensorBoard's scalar type).
//
// The protobuf is encoded field by field with protowire: the messages are
// three, their field numbers fixed since TensorFlow 1.0.
package tfevents

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the first event's file_version.
const FileVersion = "brain.Event:2"

// Field numbers of tensorflow.Event, Summary and Summary.Value
// (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto).
const (
	eventWallTime    protowire.Number = 1
	eventStep        protowire.Number = 2
	eventFileVersion protowire.Number = 3
	eventSummary     protowire.Number = 5
	summaryValue     protowire.Number = 1
	valueTag         protowire.Number = 1
	valueSimpleValue protowire.Number = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is TFRecord's masked CRC-32C of b.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// Scalar is one tagged value of a step.
type Scalar struct {
	Tag   string
	Value float64 // written as a float32
}

// Writer writes one event file's records to an io.Writer.
type Writer struct {
	w   *bufio.Writer
	buf []byte
}

// NewWriter starts an event file on w: it writes the file_version event
// stamped wallTime (seconds since the Unix epoch).
func NewWriter(w io.Writer, wallTime float64) (*Writer, error) {
	x := &Writer{w: bufio.NewWriter(w)}
	var ev []byte
	ev = protowire.AppendTag(ev, eventWallTime, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wallTime))
	ev = protowire.AppendTag(ev, eventFileVersion, protowire.BytesType)
	ev = protowire.AppendString(ev, FileVersion)
	return x, x.record(ev)
}

// Scalars writes one event at step holding the scalars, in order.
func (x *Writer) Scalars(step int64, wallTime float64, scalars []Scalar) error {
	var sum []byte
	for _, s := range scalars {
		var v []byte
		v = protowire.AppendTag(v, valueTag, protowire.BytesType)
		v = protowire.AppendString(v, s.Tag)
		v = protowire.AppendTag(v, valueSimpleValue, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(float32(s.Value)))
		sum = protowire.AppendTag(sum, summaryValue, protowire.BytesType)
		sum = protowire.AppendBytes(sum, v)
	}
	var ev []byte
	ev = protowire.AppendTag(ev, eventWallTime, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wallTime))
	ev = protowire.AppendTag(ev, eventStep, protowire.VarintType)
	ev = protowire.AppendVarint(ev, uint64(step))
	ev = protowire.AppendTag(ev, eventSummary, protowire.BytesType)
	ev = protowire.AppendBytes(ev, sum)
	return x.record(ev)
}

// record frames data as one TFRecord.
func (x *Writer) record(data []byte) error {
	x.buf = binary.LittleEndian.AppendUint64(x.buf[:0], uint64(len(data)))
	x.buf = binary.LittleEndian.AppendUint32(x.buf, MaskedCRC(x.buf[:8]))
	x.buf = append(x.buf, data...)
	x.buf = binary.LittleEndian.AppendUint32(x.buf, MaskedCRC(data))
	_, err := x.w.Write(x.buf)
	return err
}

// Flush writes what is buffered.
func (x *Writer) Flush() error { return x.w.Flush() }

// Event is one decoded event (ReadAll): a file_version event has only
// FileVersion set.
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	Scalars     []Scalar
}

// ReadAll decodes an event file written by Writer, checking every CRC. It
// reads the fields Writer writes and skips any other.
func ReadAll(r io.Reader) ([]Event, error) {
	var out []Event
	br := bufio.NewReader(r)
	for n := 0; ; n++ {
		var head [12]byte
		if _, err := io.ReadFull(br, head[:]); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("record %d: header: %w", n, err)
		}
		if MaskedCRC(head[:8]) != binary.LittleEndian.Uint32(head[8:]) {
			return nil, fmt.Errorf("record %d: the length's CRC does not match", n)
		}
		size := binary.LittleEndian.Uint64(head[:8])
		if size > 1<<30 {
			return nil, fmt.Errorf("record %d: length %d is implausible", n, size)
		}
		data := make([]byte, size+4)
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, fmt.Errorf("record %d: data: %w", n, err)
		}
		if MaskedCRC(data[:size]) != binary.LittleEndian.Uint32(data[size:]) {
			return nil, fmt.Errorf("record %d: the data's CRC does not match", n)
		}
		ev, err := decodeEvent(data[:size])
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", n, err)
		}
		out = append(out, ev)
	}
}

// eachField calls fn with each field of a protobuf message.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		if err := fn(num, typ, b[:m]); err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

func decodeEvent(b []byte) (Event, error) {
	var ev Event
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == eventWallTime && typ == protowire.Fixed64Type:
			x, _ := protowire.ConsumeFixed64(v)
			ev.WallTime = math.Float64frombits(x)
		case num == eventStep && typ == protowire.VarintType:
			x, _ := protowire.ConsumeVarint(v)
			ev.Step = int64(x)
		case num == eventFileVersion && typ == protowire.BytesType:
			s, _ := protowire.ConsumeString(v)
			ev.FileVersion = s
		case num == eventSummary && typ == protowire.BytesType:
			sum, _ := protowire.ConsumeBytes(v)
			return eachField(sum, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if num != summaryValue || typ != protowire.BytesType {
					return nil
				}
				val, _ := protowire.ConsumeBytes(v)
				var s Scalar
				if err := eachField(val, func(num protowire.Number, typ protowire.Type, v []byte) error {
					switch {
					case num == valueTag && typ == protowire.BytesType:
						s.Tag, _ = protowire.ConsumeString(v)
					case num == valueSimpleValue && typ == protowire.Fixed32Type:
						x, _ := protowire.ConsumeFixed32(v)
						s.Value = float64(math.Float32frombits(x))
					}
					return nil
				}); err != nil {
					return err
				}
				ev.Scalars = append(ev.Scalars, s)
				return nil
			})
		}
		return nil
	})
	return ev, err
}
