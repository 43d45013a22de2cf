// Command probe is the official MCP Go SDK client, used as any user would: one session and
// calls back to back, then one JSON line with every call's outcome. The tests run it across a
// rolling deploy of mcp-epoch servers; nothing here knows about mcp-epoch.
//
// It is driven by its stdin, never by a clock, so a slow machine changes nothing it proves:
// {"called": 1} goes to stdout once the first call has ended, and once stdin closes the probe
// ends the call in flight, makes one more (begun after the close), and stops.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type call struct {
	N        int    `json:"n"`
	OK       bool   `json:"ok"`
	Ms       int64  `json:"ms"`
	Progress int64  `json:"progress"`
	Text     string `json:"text,omitempty"`
	Error    string `json:"error,omitempty"`
}

func main() {
	url := flag.String("url", "", "the MCP endpoint")
	steps := flag.Int("steps", 10, "progress steps per call (0.1 s each)")
	overlap := flag.Bool("overlap", false, "one long call, and a second one sent while it runs "+
		"once a line arrives on stdin (the first call's progress is announced on stdout)")
	flag.Parse()

	var progress atomic.Int64
	firstProgress := make(chan struct{})
	var once sync.Once
	client := mcp.NewClient(&mcp.Implementation{Name: "go-probe", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			progress.Add(1)
			once.Do(func() { close(firstProgress) })
		},
	})
	ctx := context.Background()
	transport := &mcp.StreamableClientTransport{Endpoint: *url}
	// The session era (2025-11-25): sessions and Last-Event-ID resumption.
	session, err := client.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(2)
	}
	if *overlap {
		overlapping(ctx, session, *steps, firstProgress, &progress)
		return
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(closed)
	}()
	var calls []call
	for n := 1; ; n++ {
		last := isClosed(closed) // this call began after stdin closed: it is the last one
		calls = append(calls, callWork(ctx, session, n, *steps, &progress))
		if n == 1 {
			fmt.Println(`{"called": 1}`)
		}
		if last {
			break
		}
	}
	out, _ := json.Marshal(map[string]any{"session": session.ID(), "calls": calls})
	fmt.Println(string(out))
	_ = session.Close()
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func callWork(ctx context.Context, session *mcp.ClientSession, n, steps int, progress *atomic.Int64) call {
	before := progress.Load()
	began := time.Now()
	callCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	res, err := session.CallTool(callCtx, &mcp.CallToolParams{
		Name:      "work",
		Arguments: map[string]any{"uid": "go", "call": fmt.Sprintf("k%d", n), "steps": steps, "interval": 0.1},
		Meta:      mcp.Meta{"progressToken": fmt.Sprintf("p%d", n)},
	})
	c := call{N: n, Ms: time.Since(began).Milliseconds(), Progress: progress.Load() - before}
	if err != nil {
		c.Error = err.Error()
	} else if res.IsError {
		c.Error = "tool error"
	} else {
		c.OK = true
		if len(res.Content) > 0 {
			if t, ok := res.Content[0].(*mcp.TextContent); ok {
				c.Text = t.Text
			}
		}
	}
	return c
}

// overlapping runs call 1 (long) and, once told on stdin, call 2 while call 1 still runs; a
// refusal of call 2 must not take call 1 down with it.
func overlapping(ctx context.Context, session *mcp.ClientSession, steps int, first <-chan struct{}, progress *atomic.Int64) {
	done := make(chan call, 1)
	go func() { done <- callWork(ctx, session, 1, steps, progress) }()
	<-first
	fmt.Println(`{"in_flight": 1}`)
	bufio.NewReader(os.Stdin).ReadString('\n')
	second := callWork(ctx, session, 2, 1, progress)
	calls := []call{<-done, second}
	out, _ := json.Marshal(map[string]any{"session": session.ID(), "calls": calls})
	fmt.Println(string(out))
	_ = session.Close()
}
