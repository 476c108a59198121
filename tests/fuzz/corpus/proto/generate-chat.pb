editorZ
stories
systemYou are brief.
userOnce upon a time" *333?2(j*r

rThe endx€Šs1ˆ'š
(yes|no)\.¢
chat-inputªchatml