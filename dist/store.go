package dist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

// Note [torchrun's store]: torchrun's agent serves a TCPStore on
// MASTER_ADDR:MASTER_PORT, and its ranks join it as clients
// (TORCHELASTIC_USE_AGENT_STORE=True). leangrad's ranks do too, with
// storeClient, a client of its wire protocol, and use it only to meet:
// rank 0 listens for the star (rendezvous.go) on a port the system picks
// and publishes its address under a key of the run and the attempt; the
// other ranks wait for the key and connect there. The star then carries
// the job's host-side traffic and notices a dead rank, as without a
// store; -nproc and plain WORLD_SIZE launches, which have no store, meet
// at MASTER_ADDR:MASTER_PORT directly.
//
// The protocol, as PyTorch 2.11's client speaks it
// (benchmarks/pytorch/tcpstore_wire.py records it through a relay): every
// integer
// little-endian; a query is one byte of QueryType then its arguments,
// strings and byte strings as a uint64 length and the bytes, lists as a
// uint64 count and the items. On connecting, the client sends VALIDATE
// with the uint32 magic number (no answer) and PING with a uint32 nonce,
// which the server echoes: a server that answers otherwise, or hangs up,
// speaks another version, and the error says so. Keys are the user's
// with "/" before them, as PyTorch's Python client writes them.

// storeMagic is TCPStore's validationMagicNumber.
const storeMagic uint32 = 0x3C85F7CE

// The TCPStore queries storeClient sends (QueryType, TCPStoreBackend.hpp)
// and the one-byte answers it reads.
const (
	storeValidate   byte = 0
	storeSet        byte = 1
	storeGet        byte = 3
	storeAdd        byte = 4
	storeCheck      byte = 5
	storeWait       byte = 6
	storeCancelWait byte = 12
	storePing       byte = 13

	storeReady       byte = 0 // CHECK: every key is set
	storeStopWaiting byte = 0 // WAIT: every key is set
	storeCanceled    byte = 1 // CANCEL_WAIT: the wait is off
)

// storeClient is one connection to a TCPStore.
type storeClient struct {
	addr string
	c    net.Conn
}

// dialStore connects to the store at addr (retrying until deadline: the
// agent may start it after this process) and checks that it speaks the
// protocol.
func dialStore(addr string, deadline time.Time) (*storeClient, error) {
	var c net.Conn
	var err error
	for {
		c, err = net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no TCPStore at %s (MASTER_ADDR:MASTER_PORT, torchrun's agent store) within the timeout: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s := &storeClient{addr: addr, c: c}
	nonce := rand.Uint32()
	var q bytes.Buffer
	q.WriteByte(storeValidate)
	binary.Write(&q, binary.LittleEndian, storeMagic)
	q.WriteByte(storePing)
	binary.Write(&q, binary.LittleEndian, nonce)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	var echo uint32
	if _, err := c.Write(q.Bytes()); err == nil {
		err = binary.Read(c, binary.LittleEndian, &echo)
	}
	if err != nil || echo != nonce {
		c.Close()
		why := fmt.Sprintf("answered the ping %#x with %#x", nonce, echo)
		if err != nil {
			why = err.Error()
		}
		return nil, fmt.Errorf("the TCPStore at %s does not speak the protocol of PyTorch 2.4 and later (VALIDATE, then PING echoed): %s", addr, why)
	}
	return s, nil
}

func (s *storeClient) close() error { return s.c.Close() }

// query sends one query: its type and its arguments (string and []byte
// with their lengths, int64 and uint64 as they are, []string as a count
// and the strings).
func (s *storeClient) query(kind byte, args ...any) error {
	var q bytes.Buffer
	q.WriteByte(kind)
	for _, a := range args {
		switch v := a.(type) {
		case string:
			binary.Write(&q, binary.LittleEndian, uint64(len(v)))
			q.WriteString(v)
		case []byte:
			binary.Write(&q, binary.LittleEndian, uint64(len(v)))
			q.Write(v)
		case []string:
			binary.Write(&q, binary.LittleEndian, uint64(len(v)))
			for _, k := range v {
				binary.Write(&q, binary.LittleEndian, uint64(len(k)))
				q.WriteString(k)
			}
		case int64:
			binary.Write(&q, binary.LittleEndian, v)
		default:
			panic(fmt.Sprintf("dist: store query argument of type %T", a))
		}
	}
	_, err := s.c.Write(q.Bytes())
	return s.err(err)
}

// err names the store in a failed exchange.
func (s *storeClient) err(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("TCPStore at %s: %w", s.addr, err)
}

// key is the user's key as PyTorch's clients write it.
func storeKey(k string) string { return "/" + k }

// set stores value under key.
func (s *storeClient) set(key string, value []byte) error {
	return s.query(storeSet, storeKey(key), value)
}

// add adds delta to the counter under key (0 when unset) and returns it.
func (s *storeClient) add(key string, delta int64) (int64, error) {
	if err := s.query(storeAdd, storeKey(key), delta); err != nil {
		return 0, err
	}
	var v int64
	return v, s.err(binary.Read(s.c, binary.LittleEndian, &v))
}

// check reports whether every key is set.
func (s *storeClient) check(keys ...string) (bool, error) {
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = storeKey(k)
	}
	if err := s.query(storeCheck, ks); err != nil {
		return false, err
	}
	var b [1]byte
	if _, err := io.ReadFull(s.c, b[:]); err != nil {
		return false, s.err(err)
	}
	return b[0] == storeReady, nil
}

// errStoreTimeout is a wait that the deadline ended.
var errStoreTimeout = errors.New("timed out waiting for the keys")

// wait blocks until every key is set or the deadline passes; then it
// cancels the wait on the server, as PyTorch's client does, and returns
// errStoreTimeout.
func (s *storeClient) wait(deadline time.Time, keys ...string) error {
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = storeKey(k)
	}
	if err := s.query(storeWait, ks); err != nil {
		return err
	}
	var b [1]byte
	s.c.SetReadDeadline(deadline)
	_, err := io.ReadFull(s.c, b[:])
	s.c.SetReadDeadline(time.Time{})
	if err == nil {
		if b[0] != storeStopWaiting {
			return s.err(fmt.Errorf("answered a wait with %d", b[0]))
		}
		return nil
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return s.err(err)
	}
	if err := s.query(storeCancelWait); err != nil {
		return err
	}
	// The keys may have come just before the cancel: then the stop comes first.
	s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer s.c.SetReadDeadline(time.Time{})
	for {
		if _, err := io.ReadFull(s.c, b[:]); err != nil {
			return s.err(err)
		}
		if b[0] == storeCanceled {
			return errStoreTimeout
		}
	}
}

// get waits until key is set (or the deadline passes) and returns its value.
func (s *storeClient) get(deadline time.Time, key string) ([]byte, error) {
	if err := s.wait(deadline, key); err != nil {
		return nil, err
	}
	if err := s.query(storeGet, storeKey(key)); err != nil {
		return nil, err
	}
	var n uint64
	if err := binary.Read(s.c, binary.LittleEndian, &n); err != nil {
		return nil, s.err(err)
	}
	if n > 1<<30 {
		return nil, s.err(fmt.Errorf("a value of %d bytes", n))
	}
	v := make([]byte, n)
	_, err := io.ReadFull(s.c, v)
	return v, s.err(err)
}
