package dist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/tensor"
)

// testStore is a TCPStore server written from the protocol description in
// Note [torchrun's store] (the queries storeClient sends, and answers as
// PyTorch 2.11's server does), for the client's tests. With old set, it is
// a server of the protocol before PING: it hangs up on a query it does not
// know.
type testStore struct {
	ln      net.Listener
	old     bool
	mu      sync.Mutex
	kv      map[string][]byte
	waiting map[net.Conn][]string // a connection's pending wait
}

func serveStore(t *testing.T, old bool) *testStore {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testStore{ln: ln, old: old, kv: map[string][]byte{}, waiting: map[net.Conn][]string{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *testStore) addr() string { return s.ln.Addr().String() }

func (s *testStore) serve(c net.Conn) {
	defer c.Close()
	u64 := func() uint64 {
		var v uint64
		if binary.Read(c, binary.LittleEndian, &v) != nil {
			panic(io.EOF)
		}
		return v
	}
	str := func() string {
		b := make([]byte, u64())
		if _, err := io.ReadFull(c, b); err != nil {
			panic(io.EOF)
		}
		return string(b)
	}
	keys := func() []string {
		ks := make([]string, u64())
		for i := range ks {
			ks[i] = str()
		}
		return ks
	}
	defer func() { recover() }() // a read failed: the client is gone
	for {
		var q [1]byte
		if _, err := io.ReadFull(c, q[:]); err != nil {
			return
		}
		s.mu.Lock()
		switch q[0] {
		case storeValidate:
			var m uint32
			binary.Read(c, binary.LittleEndian, &m)
			if m != storeMagic {
				s.mu.Unlock()
				return
			}
		case storePing:
			if s.old {
				s.mu.Unlock()
				return
			}
			var n [4]byte
			io.ReadFull(c, n[:])
			c.Write(n[:])
		case storeSet:
			k, v := str(), str()
			s.kv[k] = []byte(v)
			for w, ks := range s.waiting {
				if s.setAll(ks) {
					w.Write([]byte{storeStopWaiting})
					delete(s.waiting, w)
				}
			}
		case storeGet:
			v := s.kv[str()]
			binary.Write(c, binary.LittleEndian, uint64(len(v)))
			c.Write(v)
		case storeAdd:
			k := str()
			var d int64
			binary.Read(c, binary.LittleEndian, &d)
			n, _ := strconv.ParseInt(string(s.kv[k]), 10, 64)
			s.kv[k] = []byte(strconv.FormatInt(n+d, 10))
			binary.Write(c, binary.LittleEndian, n+d)
		case storeCheck:
			ans := byte(1)
			if s.setAll(keys()) {
				ans = storeReady
			}
			c.Write([]byte{ans})
		case storeWait:
			if ks := keys(); s.setAll(ks) {
				c.Write([]byte{storeStopWaiting})
			} else {
				s.waiting[c] = ks
			}
		case storeCancelWait:
			delete(s.waiting, c)
			c.Write([]byte{storeCanceled})
		default:
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// setAll reports whether every key is set (the caller holds mu).
func (s *testStore) setAll(keys []string) bool {
	for _, k := range keys {
		if _, ok := s.kv[k]; !ok {
			return false
		}
	}
	return true
}

// TestStoreClient: set, get (which waits for the key), add, check, and a
// wait that times out and is cancelled, leaving the connection usable.
func TestStoreClient(t *testing.T) {
	srv := serveStore(t, false)
	deadline := time.Now().Add(5 * time.Second)
	a, err := dialStore(srv.addr(), deadline)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	b, err := dialStore(srv.addr(), deadline)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	got := make(chan []byte, 1)
	go func() {
		v, err := b.get(deadline, "addr")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	time.Sleep(50 * time.Millisecond) // b waits for the key
	if err := a.set("addr", []byte("10.0.0.1:1234")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "10.0.0.1:1234" {
		t.Errorf("get gave %q", v)
	}
	srv.mu.Lock()
	if srv.kv["/addr"] == nil {
		t.Errorf("the key is not stored as PyTorch's clients write it: %v", srv.kv)
	}
	srv.mu.Unlock()
	for _, step := range []struct {
		delta, want int64
	}{{5, 5}, {-2, 3}} {
		if n, err := a.add("count", step.delta); err != nil || n != step.want {
			t.Errorf("add %d: %d, %v; want %d", step.delta, n, err, step.want)
		}
	}
	if ok, err := a.check("addr", "count"); !ok || err != nil {
		t.Errorf("check of set keys: %v, %v", ok, err)
	}
	if ok, err := a.check("addr", "late"); ok || err != nil {
		t.Errorf("check of an unset key: %v, %v", ok, err)
	}
	if err := a.wait(time.Now().Add(100*time.Millisecond), "late"); !errors.Is(err, errStoreTimeout) {
		t.Errorf("a wait for a key never set: %v, want the timeout", err)
	}
	if n, err := a.add("count", 1); err != nil || n != 4 {
		t.Errorf("after the cancelled wait, add gave %d, %v", n, err)
	}
}

// TestStoreRefusesAnotherProtocol: a store of the protocol before PING, and
// a port that is no store, are one clear error each.
func TestStoreRefusesAnotherProtocol(t *testing.T) {
	old := serveStore(t, true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // not a store: says something else and hangs up
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	for _, addr := range []string{old.addr(), ln.Addr().String()} {
		_, err := dialStore(addr, time.Now().Add(2*time.Second))
		if err == nil || !strings.Contains(err.Error(), "does not speak the protocol of PyTorch 2.4 and later") || !strings.Contains(err.Error(), addr) {
			t.Errorf("%s: %v, want an error naming the store and the protocol", addr, err)
		}
	}
}

// TestRendezvousThroughStore: under torchrun's store the ranks meet where
// rank 0 published (a port the system picked), run collectives, and a
// rank that dies still fails the others with an error naming it.
func TestRendezvousThroughStore(t *testing.T) {
	const size = 3
	srv := serveStore(t, false)
	cfg, ok, err := ConfigFromEnv(func(k string) string {
		return map[string]string{"WORLD_SIZE": "3", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": srv.addr()[strings.LastIndex(srv.addr(), ":")+1:],
			"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "run7", "TORCHELASTIC_RESTART_COUNT": "0"}[k]
	})
	if !ok || err != nil || cfg.Store != srv.addr() || cfg.StoreKey != "leangrad/run7/0/rendezvous" || cfg.Addr != "127.0.0.1:0" {
		t.Fatalf("config %+v, %v, %v", cfg, ok, err)
	}
	for _, die := range []bool{false, true} {
		cfg.StoreKey = fmt.Sprintf("leangrad/run7/%v/rendezvous", die) // a fresh attempt
		errs := make([]error, size)
		var wg sync.WaitGroup
		for r := range size {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := cfg
				c.Rank, c.Timeout = r, 20*time.Second
				g, err := Join(tensor.NewDevice(cpu.New()), c)
				if err != nil {
					errs[r] = err
					return
				}
				if die && r == 1 {
					for _, p := range g.rv.peers {
						p.c.Close()
					}
					return
				}
				x := tensor.FromFloat32(g.Device(), []float32{float32(r)}, 1).Keep()
				defer x.Release()
				errs[r] = g.AllReduce([]*tensor.Tensor{x}, false)
				if errs[r] == nil && x.Float32s()[0] != 0+1+2 {
					errs[r] = fmt.Errorf("rank %d: all-reduce gave %v", r, x.Float32s())
				}
				for i := 0; die && i < 1000 && errs[r] == nil; i++ {
					errs[r] = g.AllReduce([]*tensor.Tensor{x}, true)
				}
				g.Close()
			}()
		}
		wg.Wait()
		for r, err := range errs {
			switch {
			case !die && err != nil:
				t.Errorf("rank %d: %v", r, err)
			case die && r != 1 && (err == nil || !strings.Contains(err.Error(), "rank 1")):
				t.Errorf("rank %d after rank 1 died: %v, want an error naming rank 1", r, err)
			}
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	published := srv.kv["/leangrad/run7/false/rendezvous"]
	if host, port, err := net.SplitHostPort(string(published)); err != nil || host != "127.0.0.1" || port == "0" {
		t.Errorf("rank 0 published %q, want 127.0.0.1 and the port it listens on", published)
	}
	if keys := slices.Sorted(maps.Keys(srv.kv)); len(keys) != 2 {
		t.Errorf("store keys %v, want one per attempt", keys)
	}
}
