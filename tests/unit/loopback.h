/* TCP on 127.0.0.1 for tests: a connection to a port (tests of the servers), a listening
 * socket (relays in front of a peer). */
#ifndef PLIANT_TEST_LOOPBACK_H
#define PLIANT_TEST_LOOPBACK_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* The connected socket, or -1. */
static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A socket listening on 127.0.0.1, its port in *port; aborts when it cannot. */
static inline int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 8) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        abort();
    *port = ntohs(a.sin_port);
    return fd;
}

#endif
