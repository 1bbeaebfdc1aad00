/* Decode only the region of a JPEG that a training crop keeps, with libjpeg-turbo.

   RandomResizedCrop keeps about half of an image's area on average, and its box depends only on
   the image's size, which the header gives. libjpeg-turbo can skip the IDCT, upsampling and
   colour conversion of the columns outside a region (jpeg_crop_scanline), skip those of the rows
   above it (jpeg_skip_scanlines still entropy-decodes them), and stop after its last row. No
   Python binding exposes these two calls (simplejpeg and Pillow decode whole images; PyTurboJPEG
   needs TurboJPEG 3, newer than the distributions' 2.1), hence this file, loaded through ctypes
   by jpeg_region.py and built by scripts/build_jpeg_region.sh.

   Anything unusual is declined rather than handled here: the caller then decodes the whole
   image as before, which also names a damaged file. */

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE */

#include <jpeglib.h>

enum { DECODED = 0, DECLINED = 1 };

struct error_manager {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
};

static void stop(j_common_ptr cinfo) {
  longjmp(((struct error_manager *)cinfo->err)->jump, 1);
}

/* level -1 is a warning: corrupt data that libjpeg would paper over. Decline, so the whole-image
   path treats the file exactly as it treats it today. Levels 0 and up are trace messages. */
static void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) stop(cinfo);
}

/* Decodes rows [top, top + height) of the RGB image in data[0:size], columns from *left (rounded
   down to an iMCU boundary, written back) to at least left + width, into `height` rows of `out`
   spaced `out_stride` bytes apart. Returns DECODED, or DECLINED with nothing promised in `out`. */
int jpeg_region_decode(const uint8_t *data, unsigned long size, int *left, int top, int width,
                       int height, uint8_t *out, long out_stride) {
  struct jpeg_decompress_struct cinfo;
  struct error_manager errors;
  JDIMENSION x, w;
  JSAMPROW row;
  int done;

  cinfo.err = jpeg_std_error(&errors.pub);
  errors.pub.error_exit = stop;
  errors.pub.emit_message = on_message;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return DECLINED;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  /* CMYK and YCCK would be converted with another formula than Pillow's: not here. */
  if (cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_GRAYSCALE &&
      cinfo.jpeg_color_space != JCS_RGB) {
    jpeg_destroy_decompress(&cinfo);
    return DECLINED;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  if (*left < 0 || top < 0 || width <= 0 || height <= 0 || cinfo.output_components != 3 ||
      (JDIMENSION)*left + (JDIMENSION)width > cinfo.output_width ||
      (JDIMENSION)top + (JDIMENSION)height > cinfo.output_height) {
    jpeg_destroy_decompress(&cinfo);
    return DECLINED;
  }
  x = (JDIMENSION)*left;
  w = (JDIMENSION)width;
  jpeg_crop_scanline(&cinfo, &x, &w);
  if ((long)w * 3 > out_stride) { /* the caller's rows cannot hold the widened region */
    jpeg_destroy_decompress(&cinfo);
    return DECLINED;
  }
  if (top > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)top) != (JDIMENSION)top) {
    jpeg_destroy_decompress(&cinfo);
    return DECLINED;
  }
  for (done = 0; done < height; done++) {
    row = out + (ptrdiff_t)done * out_stride;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      jpeg_destroy_decompress(&cinfo);
      return DECLINED;
    }
  }
  *left = (int)x;
  /* The rows below the region are never decoded. */
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return DECODED;
}

/* The SHA-256 prefix of this file's text when it was built (-DJPEG_REGION_SOURCE): jpeg_region.py
   uses no library built from another version of it. */
const char *jpeg_region_source(void) { return JPEG_REGION_SOURCE; }
