/*
 * A link's one-way delay without netem: packets held in user space.
 *
 *   link_delay DELAY_MS [QUEUE]
 *
 * This kernel has no netem qdisc (CONFIG_NET_SCH_NETEM is off), but it has
 * netfilter's queue (NFQUEUE): a rule hands each packet a node receives
 * to this process, which lets it through DELAY_MS after it came.
 * bench/emulated_cluster.py builds it (cc) and sets up the rule; why the
 * rule holds received packets, not sent ones, is said there.
 *
 * Only each packet's metadata crosses to user space (NFQNL_COPY_META), a
 * segmentation-offload packet stays one packet (NFQA_CFG_F_GSO), and one
 * batch verdict lets through every packet that is due: the delays are
 * equal, so packets leave in the order they came. In C, not Python: the
 * bench's links carry thousands of packets a second, and the holding's
 * CPU time is taken from the nodes' cores (bench/results/
 * network_scaling.md, the latency section, says how much of them each
 * took). Real-time scheduling wakes it on time on a busy core.
 */
#define _GNU_SOURCE /* ppoll */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h> /* NF_ACCEPT */
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HELD (1 << 20) /* Packets held at once, at most. */

static uint64_t due_ns[HELD];
static uint32_t ids[HELD];

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* Appends attribute `type` of `len` bytes to the message at `msg`. */
static void put(struct nlmsghdr *msg, int type, const void *data, int len) {
  struct nlattr *attr = (void *)((char *)msg + NLMSG_ALIGN(msg->nlmsg_len));
  attr->nla_type = type;
  attr->nla_len = NLA_HDRLEN + len;
  memcpy((char *)attr + NLA_HDRLEN, data, len);
  msg->nlmsg_len = NLMSG_ALIGN(msg->nlmsg_len) + NLA_ALIGN(attr->nla_len);
}

/* A queue message of `kind` for `queue`, its attributes to be put. */
static struct nlmsghdr *start(char *buf, int kind, int queue) {
  struct nlmsghdr *msg = (void *)buf;
  memset(buf, 0, NLMSG_SPACE(sizeof(struct nfgenmsg)));
  msg->nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
  msg->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | kind;
  msg->nlmsg_flags = NLM_F_REQUEST;
  struct nfgenmsg *gen = NLMSG_DATA(msg);
  gen->nfgen_family = AF_UNSPEC;
  gen->version = NFNETLINK_V0;
  gen->res_id = htons(queue);
  return msg;
}

static void send_all(int fd, struct nlmsghdr *msg) {
  if (send(fd, msg, msg->nlmsg_len, 0) < 0) die("link_delay: send");
}

static int open_queue(int queue) {
  int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
  if (fd < 0) die("link_delay: netlink socket");
  int size = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
  struct sockaddr_nl self = {.nl_family = AF_NETLINK};
  if (bind(fd, (void *)&self, sizeof self) < 0) die("link_delay: bind");
  char buf[256];
  struct nlmsghdr *msg = start(buf, NFQNL_MSG_CONFIG, queue);
  struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND,
                                     .pf = htons(AF_INET)};
  put(msg, NFQA_CFG_CMD, &cmd, sizeof cmd);
  send_all(fd, msg);
  /* The kernel takes the flags only with their mask, in one message. */
  msg = start(buf, NFQNL_MSG_CONFIG, queue);
  struct nfqnl_msg_config_params params = {.copy_range = 0,
                                           .copy_mode = NFQNL_COPY_META};
  put(msg, NFQA_CFG_PARAMS, &params, sizeof params);
  uint32_t maxlen = htonl(HELD), gso = htonl(NFQA_CFG_F_GSO);
  put(msg, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
  put(msg, NFQA_CFG_MASK, &gso, sizeof gso);
  put(msg, NFQA_CFG_FLAGS, &gso, sizeof gso);
  send_all(fd, msg);
  return fd;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: link_delay DELAY_MS [QUEUE]\n");
    return 2;
  }
  uint64_t delay = (uint64_t)(atof(argv[1]) * 1e6);
  int queue = argc > 2 ? atoi(argv[2]) : 0;
  int fd = open_queue(queue);
  struct sched_param rr = {.sched_priority = 10};
  if (sched_setscheduler(0, SCHED_RR, &rr) < 0)
    fprintf(stderr, "link_delay: no real-time scheduling (not root): "
                    "delays stretch when the cores are busy\n");
  static char buf[1 << 17];
  char out[128];
  size_t head = 0, tail = 0; /* Held: [head, tail), modulo HELD. */
  for (;;) {
    uint64_t now = now_ns();
    int due = 0;
    uint32_t last = 0;
    while (head != tail && due_ns[head % HELD] <= now) {
      last = ids[head % HELD];
      head++;
      due = 1;
    }
    if (due) {
      struct nlmsghdr *msg = start(out, NFQNL_MSG_VERDICT_BATCH, queue);
      struct nfqnl_msg_verdict_hdr verdict = {.verdict = htonl(NF_ACCEPT),
                                              .id = htonl(last)};
      put(msg, NFQA_VERDICT_HDR, &verdict, sizeof verdict);
      send_all(fd, msg);
    }
    struct timespec wait, *timeout = NULL;
    if (head != tail) {
      uint64_t left = due_ns[head % HELD] - now;
      wait.tv_sec = left / 1000000000u;
      wait.tv_nsec = left % 1000000000u;
      timeout = &wait;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (ppoll(&p, 1, timeout, NULL) <= 0) continue;
    uint64_t arrived = now_ns() + delay;
    for (;;) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        die("link_delay: recv");
      }
      for (struct nlmsghdr *msg = (void *)buf; NLMSG_OK(msg, n);
           msg = NLMSG_NEXT(msg, n)) {
        if (msg->nlmsg_type == NLMSG_ERROR) {
          struct nlmsgerr *error = NLMSG_DATA(msg);
          if (error->error) {
            errno = -error->error;
            die("link_delay: the netfilter queue refused a message");
          }
          continue;
        }
        if (msg->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
          continue;
        struct nlattr *attr =
            (void *)((char *)NLMSG_DATA(msg) + NLMSG_ALIGN(sizeof(struct nfgenmsg)));
        int left = msg->nlmsg_len - ((char *)attr - (char *)msg);
        while (left >= NLA_HDRLEN && attr->nla_len >= NLA_HDRLEN &&
               attr->nla_len <= left) {
          if ((attr->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR) {
            struct nfqnl_msg_packet_hdr *packet = (void *)((char *)attr + NLA_HDRLEN);
            if (tail - head == HELD) {
              fprintf(stderr, "link_delay: more than %d packets held\n", HELD);
              exit(1);
            }
            due_ns[tail % HELD] = arrived;
            ids[tail % HELD] = ntohl(packet->packet_id);
            tail++;
            break;
          }
          left -= NLA_ALIGN(attr->nla_len);
          attr = (void *)((char *)attr + NLA_ALIGN(attr->nla_len));
        }
      }
    }
  }
}
