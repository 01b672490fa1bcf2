package memory

import (
	"encoding/csv"
	"io"
	"strconv"
	"time"
)

// EventKind says what a timeline event records.
type EventKind uint8

// Timeline event kinds.
const (
	EventAlloc        EventKind = iota + 1 // a block was handed out
	EventFree                              // a block was returned
	EventSegmentAlloc                      // a segment was obtained from the Source
	EventSegmentFree                       // a segment was returned to the Source
	EventOOM                               // a request failed
	EventMark                              // a caller's label, such as the start of a step
)

var eventNames = [...]string{
	EventAlloc: "alloc", EventFree: "free", EventSegmentAlloc: "segment_alloc",
	EventSegmentFree: "segment_free", EventOOM: "oom", EventMark: "mark",
}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is one entry of the timeline: what happened, to how many bytes, and
// the allocated and reserved bytes just after it.
type Event struct {
	Time      time.Duration // since recording started
	Kind      EventKind
	Size      int64
	Allocated int64
	Reserved  int64
	Label     string // for EventMark
}

// Timeline is a recording of allocator events.
type Timeline struct {
	start     time.Time
	Events    []Event
	truncated bool
}

// TimelineLimit is the most events a recording keeps (about 50 MB); past it
// the recording stops and TimelineTruncated reports so.
const TimelineLimit = 1 << 20

// RecordTimeline starts (on) or stops (off) recording every allocator event.
// Starting discards an earlier recording.
func (a *Allocator) RecordTimeline(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !on {
		if a.timeline != nil {
			a.timeline.start = time.Time{}
		}
		return
	}
	a.timeline = &Timeline{start: time.Now()}
}

// Timeline returns a copy of the recorded events (nil if none were recorded).
func (a *Allocator) Timeline() []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.timeline == nil {
		return nil
	}
	return append([]Event(nil), a.timeline.Events...)
}

// Mark adds a labelled event to the timeline, if one is being recorded.
func (a *Allocator) Mark(label string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.recording() {
		a.appendEvent(Event{Kind: EventMark, Label: label})
	}
}

func (a *Allocator) recording() bool { return a.timeline != nil && !a.timeline.start.IsZero() }

func (a *Allocator) record(kind EventKind, size int64) {
	if a.recording() {
		a.appendEvent(Event{Kind: kind, Size: size})
	}
}

// TimelineTruncated reports whether the recording stopped at TimelineLimit.
func (a *Allocator) TimelineTruncated() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.timeline != nil && a.timeline.truncated
}

func (a *Allocator) appendEvent(e Event) {
	if len(a.timeline.Events) >= TimelineLimit {
		a.timeline.truncated = true
		return
	}
	e.Time = time.Since(a.timeline.start)
	e.Allocated = a.stats.Allocated[All].Current
	e.Reserved = a.stats.Reserved[All].Current
	a.timeline.Events = append(a.timeline.Events, e)
}

// WriteTimelineCSV writes events as CSV with the header
// time_s,event,size,allocated,reserved,label.
func WriteTimelineCSV(w io.Writer, events []Event) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"time_s", "event", "size", "allocated", "reserved", "label"}); err != nil {
		return err
	}
	for _, e := range events {
		rec := []string{
			strconv.FormatFloat(e.Time.Seconds(), 'f', 6, 64),
			e.Kind.String(),
			strconv.FormatInt(e.Size, 10),
			strconv.FormatInt(e.Allocated, 10),
			strconv.FormatInt(e.Reserved, 10),
			e.Label,
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
