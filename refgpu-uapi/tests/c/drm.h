/* Stand-in for the kernel's uAPI drm.h, enough for refgpu_drm.h: the
 * request-code macros as include/uapi/drm/drm.h defines them. */
#ifndef _DRM_H_STANDIN_
#define _DRM_H_STANDIN_
#include <linux/types.h>
#include <linux/ioctl.h>
#define DRM_IOCTL_BASE		'd'
#define DRM_IOW(nr, type)	_IOW(DRM_IOCTL_BASE, nr, type)
#define DRM_IOWR(nr, type)	_IOWR(DRM_IOCTL_BASE, nr, type)
#define DRM_COMMAND_BASE	0x40
#endif
