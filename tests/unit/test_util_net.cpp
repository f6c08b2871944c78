// util/net: the socket layer of `kimi serve` (POSIX sockets + poll, Winsock 2 + WSAPoll on
// Windows; this program also runs under Wine in scripts/cross-test.sh). Loopback only.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "util/net.h"

namespace net = kimi::net;

namespace {

// Waits until `s` reports one of `events` (5 s at most); the revents, 0 on timeout.
short wait_for(net::Socket s, short events) {
  net::PollFd p{s, events, 0};
  const int n = net::poll(&p, 1, 5000);
  return n > 0 ? p.revents : 0;
}

// Reads until `want` bytes arrived or the peer closed (5 s per read at most).
std::string read_n(net::Socket s, size_t want) {
  std::string got;
  char buf[256];
  while (got.size() < want) {
    if (!wait_for(s, net::kPollIn)) break;
    const long n = net::recv(s, buf, sizeof buf);
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || !net::would_block(net::last_error())) {
      break;
    }
  }
  return got;
}

struct Pair {  // a listener and one accepted connection to it
  net::Socket l = net::kNoSocket, client = net::kNoSocket, server = net::kNoSocket;
  int port = 0;
  std::string peer_addr;
  int peer_port = 0;
  Pair() {
    net::ListenError why;
    l = net::listen_tcp("127.0.0.1", 0, 16, &port, &why);
    if (l == net::kNoSocket) return;
    int err = 0;
    client = net::connect_tcp("127.0.0.1", port, &err);
    if (client == net::kNoSocket) return;
    if (!(wait_for(l, net::kPollIn) & net::kPollIn)) return;
    server = net::accept(l, &peer_addr, &peer_port, &err);
  }
  ~Pair() {
    net::close(client);
    net::close(server);
    net::close(l);
  }
};

}  // namespace

TEST(Net, ListenOnAnEphemeralPortAcceptAndExchangeBytes) {
  Pair p;
  ASSERT_NE(p.l, net::kNoSocket);
  EXPECT_GT(p.port, 0);
  EXPECT_LT(p.port, 65536);
  ASSERT_NE(p.client, net::kNoSocket);
  ASSERT_NE(p.server, net::kNoSocket);
  EXPECT_EQ(p.peer_addr, "127.0.0.1");
  EXPECT_GT(p.peer_port, 0);
  EXPECT_NE(p.peer_port, p.port);

  const std::string hello = "GET /health HTTP/1.1\r\n\r\n";
  EXPECT_EQ(net::send(p.client, hello.data(), hello.size()), static_cast<long>(hello.size()));
  EXPECT_EQ(read_n(p.server, hello.size()), hello);
  const std::string reply(100000, 'x');  // more than one read, in both directions' buffers
  size_t sent = 0;
  std::string got;
  while (got.size() < reply.size()) {
    if (sent < reply.size()) {
      const long n = net::send(p.server, reply.data() + sent, reply.size() - sent);
      if (n > 0) sent += static_cast<size_t>(n);
      else ASSERT_TRUE(net::would_block(net::last_error())) << net::error_text(net::last_error());
    }
    char buf[4096];
    const long n = net::recv(p.client, buf, sizeof buf);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    else if (n < 0) ASSERT_TRUE(net::would_block(net::last_error())) << net::error_text(net::last_error());
    else FAIL() << "end of stream after " << got.size() << " bytes";
    if (n <= 0) wait_for(p.client, net::kPollIn);
  }
  EXPECT_EQ(got, reply);
}

TEST(Net, ReceivingWithNothingThereWouldBlock) {
  Pair p;
  ASSERT_NE(p.server, net::kNoSocket);
  char c;
  EXPECT_EQ(net::recv(p.server, &c, 1), -1);
  EXPECT_TRUE(net::would_block(net::last_error()));
  EXPECT_FALSE(net::peer_closed(p.server));
  net::PollFd pf{p.server, net::kPollIn, 0};
  EXPECT_EQ(net::poll(&pf, 1, 50), 0);  // nothing to read: the poll times out
}

TEST(Net, PeerClosedAfterShutdownButNotWhileDataWaits) {
  Pair p;
  ASSERT_NE(p.server, net::kNoSocket);
  ASSERT_EQ(net::send(p.client, "ab", 2), 2);
  net::shutdown_send(p.client);
  ASSERT_TRUE(wait_for(p.server, net::kPollIn));
  EXPECT_FALSE(net::peer_closed(p.server));  // "ab" is still unread
  EXPECT_EQ(read_n(p.server, 2), "ab");
  EXPECT_TRUE(net::peer_closed(p.server));  // then the end of the stream
  char c;
  EXPECT_EQ(net::recv(p.server, &c, 1), 0);
  // the other direction still works after the client's shutdown
  ASSERT_EQ(net::send(p.server, "cd", 2), 2);
  EXPECT_EQ(read_n(p.client, 2), "cd");
}

TEST(Net, APortInUseIsAnErrorNamedAsSuch) {
  Pair p;
  ASSERT_NE(p.l, net::kNoSocket);
  net::ListenError why;
  int port = 0;
  const net::Socket second = net::listen_tcp("127.0.0.1", p.port, 16, &port, &why);
  EXPECT_EQ(second, net::kNoSocket);
  net::close(second);
  EXPECT_TRUE(why.in_use) << why.text;
  EXPECT_FALSE(why.unresolved);
  EXPECT_FALSE(why.text.empty());
}

TEST(Net, AnUnresolvableHostIsNamedAsSuch) {
  net::ListenError why;
  int port = 0;
  EXPECT_EQ(net::listen_tcp("no-such-host.invalid", 0, 16, &port, &why), net::kNoSocket);
  EXPECT_TRUE(why.unresolved);
  EXPECT_FALSE(why.text.empty());
  int err = 0;
  EXPECT_EQ(net::connect_tcp("no-such-host.invalid", 80, &err), net::kNoSocket);
  EXPECT_EQ(err, -1);
}

TEST(Net, NothingPendingToAcceptWouldBlock) {
  net::ListenError why;
  int port = 0;
  const net::Socket l = net::listen_tcp("127.0.0.1", 0, 16, &port, &why);
  ASSERT_NE(l, net::kNoSocket) << why.text;
  std::string addr;
  int peer = 0, err = 0;
  EXPECT_EQ(net::accept(l, &addr, &peer, &err), net::kNoSocket);
  EXPECT_TRUE(net::would_block(err)) << net::error_text(err);
  net::close(l);
}

TEST(Net, WakerWakesAPollFromAnotherThreadAndDrains) {
  net::Waker w;
  net::PollFd p{w.fd(), net::kPollIn, 0};
  EXPECT_EQ(net::poll(&p, 1, 0), 0);  // nothing yet
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    w.notify();
    w.notify();
  });
  p.revents = 0;
  EXPECT_EQ(net::poll(&p, 1, 10000), 1);
  EXPECT_TRUE(p.revents & net::kPollIn);
  t.join();
  w.drain();
  p.revents = 0;
  EXPECT_EQ(net::poll(&p, 1, 0), 0);  // both notifications consumed
}

TEST(Net, ErrorTextIsOneLine) {
  int err = 0;
  net::ListenError why;
  int port = 0;
  const net::Socket l = net::listen_tcp("127.0.0.1", 0, 16, &port, &why);
  ASSERT_NE(l, net::kNoSocket);
  std::string addr;
  int peer = 0;
  net::accept(l, &addr, &peer, &err);
  net::close(l);
  const std::string t = net::error_text(err);
  EXPECT_FALSE(t.empty());
  EXPECT_EQ(t.find('\n'), std::string::npos) << t;
  EXPECT_EQ(t.find('\r'), std::string::npos) << t;
}
